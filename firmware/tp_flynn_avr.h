/* FlyNN's AVR kernels: the optimised twins of tp_flynn.c's reference kernels for a seeded M over narrow inputs
 * (the scan of four rows at once and the block generator), included by tp_flynn.c when tinyproto.h chooses the
 * AVR kernels (TP_KERNELS_AVR). They compute exactly the integers of the reference, and define TP_FLYNN_AVR_SCAN,
 * which retires it. Included inside tp_flynn.c's seeded narrow section (TP_FLYNN_SEEDED, !TP_FLYNN_WIDE). */
#define TP_FLYNN_AVR_SCAN 1

/* tp_flynn_sum4: each pattern offset costs one pattern byte and one pointer set-up, then four adjacent bytes
 * (ld Z+): 21 cycles per offset for four rows instead of 36 row by row. */
#if TP_FLYNN_S <= 32
#define TP_FLYNN_LOOP_HEAD ".rept %[s]\n\t"
#define TP_FLYNN_LOOP_TAIL ".endr\n\t"
#else /* long patterns: a counted loop keeps the code small (3 cycles per offset more) */
#define TP_FLYNN_LOOP_HEAD "ldi r31, %[s]\n\tmov %[n], r31\n\t1:\n\t"
#define TP_FLYNN_LOOP_TAIL "dec %[n]\n\tbreq 2f\n\trjmp 1b\n\t2:\n\t"
#endif

static inline tp_flynn_sums4_t tp_flynn_sum4(const uint8_t *base, const uint8_t *pattern)
{
    tp_flynn_sums4_t out;
    uint16_t a, b, c, d;
    uint8_t t, n;
    (void)n;
    asm volatile("clr %B[a]\n\t"
                 "clr %B[b]\n\t"
                 "clr %B[c]\n\t"
                 "clr %B[d]\n\t"
                 "clr %A[a]\n\t"
                 "inc %A[a]\n\t"
                 "mov %A[b], %A[a]\n\t"
                 "mov %A[c], %A[a]\n\t"
                 "mov %A[d], %A[a]\n\t" TP_FLYNN_LOOP_HEAD
                 "ld %[t], X+\n\t"
                 "movw r30, %[base]\n\t"
                 "add r30, %[t]\n\t"
                 "adc r31, __zero_reg__\n\t"
                 "ld %[t], Z+\n\t"
                 "add %A[a], %[t]\n\t"
                 "adc %B[a], __zero_reg__\n\t"
                 "ld %[t], Z+\n\t"
                 "add %A[b], %[t]\n\t"
                 "adc %B[b], __zero_reg__\n\t"
                 "ld %[t], Z+\n\t"
                 "add %A[c], %[t]\n\t"
                 "adc %B[c], __zero_reg__\n\t"
                 "ld %[t], Z\n\t"
                 "add %A[d], %[t]\n\t"
                 "adc %B[d], __zero_reg__\n\t" TP_FLYNN_LOOP_TAIL
                 : [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d), [t] "=&r"(t), [n] "=&r"(n),
                   "+x"(pattern)
                 : [base] "r"(base), [s] "n"(TP_FLYNN_S)
                 : "r30", "r31", "memory");
    out.sum[0] = a;
    out.sum[1] = b;
    out.sum[2] = c;
    out.sum[3] = d;
    return out;
}

/* One proposal into %[p]: the next byte of the stream (the low byte left over from the last xorshift16 step,
 * or a new step's high byte) mapped to (b * inputs) >> 8. 12 cycles per step, 7 per byte besides. */
#define TP_FLYNN_NEXT_ASM(L)                                                                                      \
    "tst %[half]\n\t"                                                                                          \
    "breq " #L "0f\n\t"                                                                                        \
    "mov %[p], %A[st]\n\t"                                                                                     \
    "clr %[half]\n\t"                                                                                          \
    "rjmp " #L "1f\n\t" #L "0:\n\t"                                                                            \
    "mov __tmp_reg__, %B[st]\n\t"                                                                              \
    "lsr __tmp_reg__\n\t"                                                                                      \
    "mov __tmp_reg__, %A[st]\n\t"                                                                              \
    "ror __tmp_reg__\n\t"                                                                                      \
    "eor %B[st], __tmp_reg__\n\t"                                                                              \
    "clr __tmp_reg__\n\t"                                                                                      \
    "ror __tmp_reg__\n\t"                                                                                      \
    "eor %A[st], __tmp_reg__\n\t"                                                                              \
    "mov __tmp_reg__, %B[st]\n\t"                                                                              \
    "lsr __tmp_reg__\n\t"                                                                                      \
    "eor %A[st], __tmp_reg__\n\t"                                                                              \
    "eor %B[st], %A[st]\n\t"                                                                                   \
    "mov %[p], %B[st]\n\t"                                                                                     \
    "inc %[half]\n\t" #L "1:\n\t" TP_FLYNN_MAP_ASM
#if TP_FLYNN_INPUTS == 256
#define TP_FLYNN_MAP_ASM ""
#else
#define TP_FLYNN_MAP_ASM "mul %[p], %[n]\n\tmov %[p], r1\n\t"
#endif

/* tp_flynn_block: the block's pattern and first rotation from the proposal stream, the repeat scan included. */
static void tp_flynn_block(uint8_t *pattern, uint8_t *rot, uint16_t *state_io, uint8_t *half_io)
{
    uint16_t state = *state_io;
    uint8_t half = *half_io;
    uint8_t p, t;
    const uint8_t *end = pattern + TP_FLYNN_S;
    asm volatile("movw r30, %[pat]\n\t"
                 "2:\n\t" TP_FLYNN_NEXT_ASM(3)
                 "st Z, %[p]\n\t"
                 "movw r26, %[pat]\n\t"
                 "4:\n\t"
                 "ld %[t], X+\n\t"
                 "cp %[t], %[p]\n\t"
                 "brne 4b\n\t"
                 "sbiw r26, 1\n\t"
                 "cp r26, r30\n\t"
                 "cpc r27, r31\n\t"
                 "brne 2b\n\t"
                 "adiw r30, 1\n\t"
                 "cp r30, %A[end]\n\t"
                 "cpc r31, %B[end]\n\t"
                 "brne 2b\n\t"
                 TP_FLYNN_NEXT_ASM(6)
                 "clr __zero_reg__"
                 : [st] "+r"(state), [half] "+r"(half), [p] "=&r"(p), [t] "=&r"(t)
                 : [pat] "r"(pattern), [end] "r"(end), [n] "r"((uint8_t)TP_FLYNN_INPUTS)
                 : "r26", "r27", "r30", "r31", "memory");
    *rot = p;
    *state_io = state;
    *half_io = half;
}
