/* tinyproto runtime: the AVR twins of the primitives every kernel uses (the portable reference is in tinyproto.h,
 * which includes this file when it chooses the AVR kernels: TP_KERNELS_AVR). Each gives the same result as its
 * reference on every input. */
#ifndef TP_AVR_H
#define TP_AVR_H

/* 8x8 -> 16-bit multiplies. avr-gcc widens a product that feeds a 32-bit sum into a library call
 * (__mulhisi3 / __umulhisi3, ~20-30 cycles); these are one hardware multiply (2 cycles) each. */
static inline int16_t tp_mul_s8(int8_t a, int8_t b)
{
    int16_t product;
    __asm__("muls %1, %2\n\tmovw %0, r0\n\tclr __zero_reg__" : "=r"(product) : "d"(a), "d"(b));
    return product;
}
static inline uint16_t tp_mul_u8(uint8_t a, uint8_t b)
{
    uint16_t product;
    __asm__("mul %1, %2\n\tmovw %0, r0\n\tclr __zero_reg__" : "=r"(product) : "r"(a), "r"(b));
    return product;
}
static inline int16_t tp_mul_s8u8(int8_t a, uint8_t b)
{
    int16_t product;
    __asm__("mulsu %1, %2\n\tmovw %0, r0\n\tclr __zero_reg__" : "=r"(product) : "a"(a), "a"(b));
    return product;
}
/* Read one flash byte and advance the pointer (`lpm Rd, Z+`: no address arithmetic per element). */
static inline int8_t tp_next_i8(const int8_t **p)
{
    int8_t value;
    const int8_t *q = *p;
    __asm__("lpm %0, Z+" : "=r"(value), "+z"(q));
    *p = q;
    return value;
}
static inline uint8_t tp_next_u8(const uint8_t **p)
{
    uint8_t value;
    const uint8_t *q = *p;
    __asm__("lpm %0, Z+" : "=r"(value), "+z"(q));
    *p = q;
    return value;
}

/* A 16-bit unsigned variable shifted right in place by a constant number of bits: always `bits` unrolled
 * lsr / ror pairs (2 cycles a bit). avr-gcc -Os picks an unrolled shift or a counted loop (5 cycles a bit) by how
 * the surrounding loop's registers fall, which the model's shape alone does not decide, so a cost model could
 * not count it. */
#define TP_SHR16_BY(value, bits)                                                                                  \
    __asm__(".rept %[n]\n\t"                                                                                      \
            "lsr %B[v]\n\t"                                                                                        \
            "ror %A[v]\n\t"                                                                                        \
            ".endr"                                                                                                \
            : [v] "+r"(value)                                                                                      \
            : [n] "n"(bits))

#endif /* TP_AVR_H */
