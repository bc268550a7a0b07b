/* BNC's AVR kernel: the optimised twin of tp_bnc.c's reference bitmap-byte kernel (a sparse stored W), included
 * by tp_bnc.c when tinyproto.h chooses the AVR kernels (TP_KERNELS_AVR). It adds exactly the products of the
 * reference and defines TP_BNC_AVR_BYTE, which retires it. */
#define TP_BNC_AVR_BYTE 1

/* One bitmap byte on AVR: for each set bit t, sum += W * x[t]. A clear bit costs 3 cycles (sbrs, rjmp), a set
 * bit 16 (lpm of the weight, ldd of the input, muls, sign of the product into the top bytes, 32-bit add):
 * about half of what avr-gcc makes of the C below, which computes the same sums. r1 (avr-gcc's zero register)
 * holds products inside the block and is cleared at its end. */
#define TP_BNC_BIT_ASM(t)                                                                                        \
    "sbrs %[bits], " #t "\n\t"                                                                                   \
    "rjmp 1f\n\t"                                                                                              \
    "lpm %[w], Z+\n\t"                                                                                         \
    "ldd %[v], %a[x]+" #t "\n\t"                                                                                \
    "muls %[w], %[v]\n\t"                                                                                      \
    "mov %[w], r1\n\t"                                                                                         \
    "lsl %[w]\n\t"                                                                                             \
    "sbc %[w], %[w]\n\t"                                                                                       \
    "add %A[sum], r0\n\t"                                                                                      \
    "adc %B[sum], r1\n\t"                                                                                      \
    "adc %C[sum], %[w]\n\t"                                                                                    \
    "adc %D[sum], %[w]\n\t"                                                                                    \
    "1:\n\t"

static inline __attribute__((always_inline)) void tp_bnc_byte(uint8_t bits, const int8_t *x, const int8_t **p,
                                                               int32_t *sum)
{
    uint8_t w, v;
    const int8_t *q = *p;
    int32_t s = *sum;
    __asm__ volatile(TP_BNC_BIT_ASM(0) TP_BNC_BIT_ASM(1) TP_BNC_BIT_ASM(2) TP_BNC_BIT_ASM(3)
                     TP_BNC_BIT_ASM(4) TP_BNC_BIT_ASM(5) TP_BNC_BIT_ASM(6) TP_BNC_BIT_ASM(7)
                     "clr __zero_reg__"
                     : [sum] "+r"(s), "+z"(q), [w] "=&d"(w), [v] "=&d"(v)
                     : [bits] "r"(bits), [x] "b"(x)
                     : "r0");
    *p = q;
    *sum = s;
}
