/* Bloom features' AVR kernels: the optimised twins of tp_bloom.c's reference generator step and row dot product,
 * included by tp_bloom.c when tinyproto.h chooses the AVR kernels (TP_KERNELS_AVR). Each computes exactly the
 * integers of its reference and defines the flag that retires it: TP_BLOOM_AVR_STEP, TP_BLOOM_AVR_ROW. */

/* One xorshift16 (7, 9, 8) step in bytes (12 cycles): s << 7 is (hi:lo) >> 1 moved up a byte,
 * s >> 9 is hi >> 1, s << 8 is lo moved up; avr-gcc's own code for the 16-bit shifts takes about 30. */
#define TP_BLOOM_AVR_STEP 1
static inline __attribute__((always_inline)) uint16_t tp_bloom_step(uint16_t s)
{
    uint8_t t1, t2;
    __asm__("mov %[t1], %B[s]\n\t"
            "lsr %[t1]\n\t"        /* C = hi bit 0 */
            "mov %[t1], %A[s]\n\t"
            "ror %[t1]\n\t"        /* t1 = hi0 << 7 | lo >> 1: the high byte of s << 7; C = lo bit 0 */
            "clr %[t2]\n\t"        /* an eor: C is kept */
            "ror %[t2]\n\t"        /* t2 = lo0 << 7: the low byte of s << 7 */
            "eor %B[s], %[t1]\n\t"
            "eor %A[s], %[t2]\n\t"
            "mov %[t1], %B[s]\n\t"
            "lsr %[t1]\n\t"
            "eor %A[s], %[t1]\n\t" /* s ^= s >> 9 */
            "eor %B[s], %A[s]\n\t" /* s ^= s << 8 */
            : [s] "+r"(s), [t1] "=&r"(t1), [t2] "=&r"(t2));
    return s;
}

#if TP_BLOOM_USED <= 256
#define TP_BLOOM_AVR_ROW 1
/* sum_p W[p] phi'[p] for one row: W in flash through Z, phi' in SRAM through X. |sum| <= 128 * 255 * USED < 2^23
 * for USED <= 256, so a 24-bit accumulator is exact: each signed product is added biased by 0x8000 (its top bit
 * flipped: now unsigned) modulo 2^24, and USED * 0x8000 is taken off once at the end. Per term lpm 3 + ld 2 +
 * mulsu 2 + biased add 4 = 11 cycles; four terms per loop step, then the remainder. */
#define TP_BLOOM_TERM                                                                                          \
    "lpm %[w], Z+\n\t"                                                                                         \
    "ld %[f], X+\n\t"                                                                                          \
    "mulsu %[w], %[f]\n\t"                                                                                     \
    "eor r1, %[k80]\n\t"                                                                                       \
    "add %A[acc], r0\n\t"                                                                                      \
    "adc %B[acc], r1\n\t"                                                                                      \
    "adc %C[acc], %[zero]\n\t"
TP_NOINLINE static int32_t tp_bloom_row(const int8_t *w, const uint8_t *phi)
{
    __uint24 acc = 0;
    uint8_t wv, fv, zero = 0, k80 = 0x80;
#if TP_BLOOM_USED >= 4
    uint8_t n = (uint8_t)(TP_BLOOM_USED / 4); /* 1..64 */
    __asm__ volatile("1:\n\t" TP_BLOOM_TERM TP_BLOOM_TERM TP_BLOOM_TERM TP_BLOOM_TERM
                     "dec %[n]\n\t"
                     "breq 2f\n\t"
                     "rjmp 1b\n\t"
                     "2:\n\t"
                     "clr __zero_reg__\n\t"
                     : [acc] "+r"(acc), [n] "+r"(n), [w] "=&a"(wv), [f] "=&a"(fv), "+z"(w), "+x"(phi)
                     : [zero] "r"(zero), [k80] "r"(k80)
                     : "r0", "memory");
#endif
#if TP_BLOOM_USED % 4 != 0
    __asm__ volatile(
#if TP_BLOOM_USED % 4 >= 1
        TP_BLOOM_TERM
#endif
#if TP_BLOOM_USED % 4 >= 2
        TP_BLOOM_TERM
#endif
#if TP_BLOOM_USED % 4 >= 3
        TP_BLOOM_TERM
#endif
        "clr __zero_reg__\n\t"
        : [acc] "+r"(acc), [w] "=&a"(wv), [f] "=&a"(fv), "+z"(w), "+x"(phi)
        : [zero] "r"(zero), [k80] "r"(k80)
        : "r0", "memory");
#endif
    /* USED << 15 as (USED << 7) << 8 (USED <= 256: fits 16 bits before the byte move) */
    __uint24 bias = (__uint24)(uint16_t)((uint16_t)TP_BLOOM_USED << 7) << 8;
    return (int32_t)(__int24)(__uint24)(acc - bias);
}
#endif

#ifdef TP_UNKNOWN_RANGE_LOW
#define TP_BLOOM_AVR_COMPACT 1
#define TP_BLOOM_STR_(x) #x
#define TP_BLOOM_STR(x) TP_BLOOM_STR_(x)
#define TP_BLOOM_PHI_USED (tp_bloom_phi + (TP_BLOOM_M - TP_BLOOM_USED)) /* where the compaction leaves phi' */
/* The compaction with the range check's sum (compile --unknown-rate only): phi's non-zero values moved up in place
 * to its last TP_BLOOM_USED slots, in slot order, every value (shifted right by TP_BLOOM_RANGE_SHIFT) added to sum,
 * which starts at -TP_UNKNOWN_RANGE_LOW. One pass down phi, the sum fused into it: per slot ld -Z, add, adc, cpse
 * (which skips the store of a 0), st -X, and the start compared on Z's low byte (its high byte too when M > 256):
 * 9 cycles a slot, 1 more a used one, in as many bytes as avr-gcc's loop without the sum. Z then points at phi,
 * right after tp_bloom_next (tp_bloom.c's struct tp_bloom_ranged), which the same pointer sets as it leaves: 0xFF
 * (high byte: no feature's index), then the bin, the sum's high byte (low byte), which tp_judge reads. */
typedef char tp_bloom_next_before_phi[__builtin_offsetof(struct tp_bloom_ranged, phi) == 2 ? 1 : -1];
static inline __attribute__((always_inline)) void tp_bloom_compact(uint16_t sum)
{
    const uint8_t *src = tp_bloom_phi + TP_BLOOM_M;
    uint8_t *dst = tp_bloom_phi + TP_BLOOM_M;
    uint8_t t;
    __asm__ volatile("1:\n\t"
                     "ld __tmp_reg__, -Z\n\t"
#if TP_BLOOM_RANGE_SHIFT == 0
                     "add %A[sum], __tmp_reg__\n\t"
#else
                     "mov %[t], __tmp_reg__\n\t"
                     ".rept " TP_BLOOM_STR(TP_BLOOM_RANGE_SHIFT) "\n\t"
                     "lsr %[t]\n\t"
                     ".endr\n\t"
                     "add %A[sum], %[t]\n\t"
#endif
                     "adc %B[sum], __zero_reg__\n\t"
                     "cpse __tmp_reg__, __zero_reg__\n\t"
                     "st -X, __tmp_reg__\n\t"
                     "cpi r30, lo8(%[start])\n\t"
#if TP_BLOOM_M > 256
                     "ldi %[t], hi8(%[start])\n\t"
                     "cpc r31, %[t]\n\t"
#endif
                     "brne 1b\n\t"
                     "ldi %[t], 0xFF\n\t"
                     "st -Z, %[t]\n\t"
                     "st -Z, %B[sum]\n\t"
                     : [sum] "+r"(sum), "+z"(src), "+x"(dst), [t] "=&d"(t)
                     : [start] "i"(tp_bloom_phi)
                     : "memory");
}
#endif
