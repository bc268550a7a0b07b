/* ProtoNN's AVR kernels: the optimised twins of tp_protonn.c's reference kernels, included by it when
 * tinyproto.h chooses the AVR kernels (TP_KERNELS_AVR). Each twin computes exactly the integers of its reference
 * (the tests run both on the simulated board against the host reference) and defines the flag that retires it:
 *   TP_PROTONN_AVR_RESCALE  tp_protonn_rescale in 16 bits
 *   TP_PROTONN_AVR_PROJECT  tp_protonn_project (row-major W)
 *   TP_PROTONN_AVR_KERNELS  tp_protonn_kernels and tp_protonn_all_scores (distances, kernel values, scores)
 *   TP_PROTONN_AVR_ACC      the stream's 24-bit sums
 *
 * The three inner loops (projection, distances, scores) are hand-scheduled inline assembly with 24-bit
 * accumulators, for the shapes within the bounds below; any other shape runs the reference.
 *
 * Accumulator widths (|W|, |B|, |Z| <= 128 and |x| <= 128 even for int8 models not made by the solver):
 *   projection  |p_r| <= 128 * 128 * nnz(row) <= 16384 * TP_N_FEATURES      -> signed 24 bit for d <= 511
 *   distance    d_j   <= (127 + 128)^2 * TP_PROTONN_DIM = 65025 * D             -> unsigned 24 bit for D <= 258
 *   scores      |s_l| <= 128 * 255 * TP_PROTONN_PROTOS = 32640 * m              -> signed 24 bit for m <= 256
 * (16 bits are not enough: one digits row already reaches 16384 * 64.) Signed 16-bit products are added as
 * unsigned (p + 0x8000: flipping the product's top bit) modulo 2^24, and n * 0x8000 is taken off once at the end
 * (n = terms added); the true sum fits in 24 signed bits, so the wrapped result is exact.
 */
#if TP_PROTONN_DIM <= 255 && TP_PROTONN_PROTOS <= 256
#define TP_PROTONN_ASM 1
#else
#define TP_PROTONN_ASM 0
#endif
/* The row kernels' 24-bit projection bound also needs d <= 511 (distances and scores do not depend on d). */
#if TP_PROTONN_ASM && TP_N_FEATURES <= 511
#define TP_PROTONN_ASM_ROWS 1
#else
#define TP_PROTONN_ASM_ROWS 0
#endif

/* The stream's sums in 24 bits where every row's nonzeros keep |p_r| < 2^23 (TP_PROTONN_ACC24). */
#if TP_PROTONN_ACC24
#define TP_PROTONN_AVR_ACC 1
typedef __int24 tp_protonn_acc_t;
#endif

#if TP_PROTONN_ASM
/* gcc sizes an asm statement by counting its lines, so a `.rept` block looks one instruction long and a C loop
 * branching back over it could get a short branch that does not reach (the link fails). Padding with empty lines
 * (nothing to the assembler) makes gcc's estimate an upper bound: 768 lines, more than the words a .rept of up
 * to 64 ten-word terms emits. */
#define TP_PROTONN_PAD8 "\n\n\n\n\n\n\n\n"
#define TP_PROTONN_PAD32 TP_PROTONN_PAD8 TP_PROTONN_PAD8 TP_PROTONN_PAD8 TP_PROTONN_PAD8
#define TP_PROTONN_PAD64 TP_PROTONN_PAD32 TP_PROTONN_PAD32
#define TP_PROTONN_PAD192 TP_PROTONN_PAD64 TP_PROTONN_PAD64 TP_PROTONN_PAD64
#define TP_PROTONN_PAD384 TP_PROTONN_PAD192 TP_PROTONN_PAD192
#define TP_PROTONN_PAD TP_PROTONN_PAD384 TP_PROTONN_PAD384 "\n\t"
/* Drop the n * 0x8000 bias of n biased products and sign-extend the 24-bit sum. */
static inline int32_t tp_protonn_unbias(__uint24 acc, uint16_t n)
{
    /* n << 15 as (n << 7) << 8: a 16-bit shift and a byte move (a 24-bit shift by 15 is a 15-step loop);
     * n <= 511, so n << 7 fits 16 bits. */
    __uint24 bias = (__uint24)(uint16_t)(n << 7) << 8;
    return (int32_t)(__int24)(__uint24)(acc - bias);
}

/* The row kernels' rescale in assembly (TP_PROTONN_ROW_Z_ASM): the row sum starts at the rounding half instead of
 * 0, and z = clamp((p + half) >> RSHIFT, +-127) is read from the sum's bytes 1..2 (>> 8 for free), shifted
 * RSHIFT - 8 more and clamped in 16 bits: about 14 + 2 (RSHIFT - 8) cycles instead of avr-gcc's ~50 for the
 * C rescale. Needs |p + half| < 2^23, the same bound as tp_protonn_rescale's 16-bit path. */
#if TP_PROTONN_ASM_ROWS && !TP_PROTONN_OFFSET && TP_PROTONN_PROJ_RSHIFT >= 8 && \
    (16384L * TP_N_FEATURES + (1L << (TP_PROTONN_PROJ_RSHIFT - 1))) < 8388608L
#define TP_PROTONN_ROW_Z_ASM 1
#define TP_PROTONN_HALF ((__uint24)1 << (TP_PROTONN_PROJ_RSHIFT - 1))
/* n biased products were added (n * 0x8000 too much, n <= 511): take it off bytes 1 and 2. */
static inline __attribute__((always_inline)) __uint24 tp_protonn_drop_bias(__uint24 acc, uint16_t n)
{
    __asm__("lsr %B[n]\n\t"
            "ror %A[n]\n\t" /* n >> 1, carry = n & 1 */
            "ror %B[n]\n\t" /* 0x80 * (n & 1) */
            "sub %B[acc], %B[n]\n\t"
            "sbc %C[acc], %A[n]\n\t"
            : [acc] "+r"(acc), [n] "+r"(n));
    return acc;
}
/* z = clamp(acc >> RSHIFT, +-127) for acc = p + half as a 24-bit two's complement value. */
static inline __attribute__((always_inline)) int8_t tp_protonn_row_z(__uint24 acc)
{
    uint8_t tmp;
    __asm__(".rept %[k]\n\t"
            "asr %C[acc]\n\t"
            "ror %B[acc]\n\t"
            ".endr\n\t"
            "cpi %B[acc], 0x80\n\t"
            "cpc %C[acc], __zero_reg__\n\t"
            "brlt 1f\n\t"
            "ldi %B[acc], 0x7F\n\t" /* q >= 128 */
            "rjmp 2f\n\t"
            "1:\n\t"
            "cpi %B[acc], 0x81\n\t"
            "ldi %[t], 0xFF\n\t"
            "cpc %C[acc], %[t]\n\t"
            "brge 2f\n\t"
            "ldi %B[acc], 0x81\n\t" /* q < -127 */
            "2:\n\t"
            : [acc] "+d"(acc), [t] "=&d"(tmp)
            : [k] "n"(TP_PROTONN_PROJ_RSHIFT - 8));
    return (int8_t)(uint8_t)(acc >> 8);
}
#else
#define TP_PROTONN_ROW_Z_ASM 0
#endif

#if TP_PROTONN_ROW_Z_ASM
/* The reference rescale in 16 bits: |p + half| < 2^23 (the projection bound above), so (p + half) >> 8 fits an
 * int16 and the remaining shift and the clamp are 16-bit (avr-gcc shifts an int32 one bit per 5-cycle loop step). */
#define TP_PROTONN_AVR_RESCALE 1
static int8_t tp_protonn_rescale(int32_t p)
{
    int16_t q = (int16_t)((p + ((int32_t)1 << (TP_PROTONN_PROJ_RSHIFT - 1))) >> 8);
    q = (int16_t)(q >> (TP_PROTONN_PROJ_RSHIFT - 8));
    if (q > TP_PROTONN_PZ_MAX) {
        return TP_PROTONN_PZ_MAX;
    }
    if (q < -TP_PROTONN_PZ_MAX) {
        return -TP_PROTONN_PZ_MAX;
    }
    return (int8_t)q;
}
#endif

#if !TP_PROTONN_ROWMAJOR
/* no row kernels: a column-major W runs the streamed projection */
#elif TP_PROTONN_ASM_ROWS && TP_PROTONN_W_DENSE
/* Dense W, rows in groups of up to 4 (tp_protonn_W: each group input by input, the group's G weights of input i
 * together, see encoding.dense_layout): one ld of x_i (2) serves G products, each lpm 3 + muls 2 + biased
 * 24-bit add 4 = 9 cycles, so 9 + 2 / G per term; 8 inputs per loop step, then the remainder. The group's sums
 * (r2..r13, row g in r(2+3g)..r(4+3g)) start at `start` (the rounding half and the d biased products' bias
 * folded in when the rescale is asm) and are stored to acc[] for the rescale. */
#define TP_PROTONN_DENSE_ROW(a, b, c)                                                                           \
    "lpm r21, Z+\n\t"                                                                                      \
    "muls r21, r20\n\t"                                                                                    \
    "eor r1, r23\n\t"                                                                                      \
    "add " a ", r0\n\t"                                                                                    \
    "adc " b ", r1\n\t"                                                                                    \
    "adc " c ", r22\n\t"
#define TP_PROTONN_DENSE_INPUT                                                                                  \
    "ld r20, X+\n\t" TP_PROTONN_DENSE_ROW("r2", "r3", "r4")                                                     \
    ".if %[g] > 1\n\t" TP_PROTONN_DENSE_ROW("r5", "r6", "r7") ".endif\n\t"                                      \
    ".if %[g] > 2\n\t" TP_PROTONN_DENSE_ROW("r8", "r9", "r10") ".endif\n\t"                                     \
    ".if %[g] > 3\n\t" TP_PROTONN_DENSE_ROW("r11", "r12", "r13") ".endif\n\t"
#define TP_PROTONN_DENSE_INIT(a, b, c) "mov " a ", %A[start]\n\tmov " b ", %B[start]\n\tmov " c ", %C[start]\n\t"
/* Store a row's sum (for the C rescale), or with the asm rescale (zasm) z itself: bytes 1..2 (>> 8 for free),
 * RSHIFT - 8 arithmetic shifts, clamped to +-127 (as tp_protonn_row_z). */
#define TP_PROTONN_DENSE_STORE(a, b, c)                                                                         \
    ".if %[zasm]\n\t"                                                                                      \
    "mov r24, " b "\n\t"                                                                                   \
    "mov r25, " c "\n\t"                                                                                   \
    ".rept %[k]\n\t"                                                                                       \
    "asr r25\n\t"                                                                                          \
    "ror r24\n\t"                                                                                          \
    ".endr\n\t"                                                                                            \
    "cpi r24, 0x80\n\t"                                                                                    \
    "cpc r25, r22\n\t"                                                                                     \
    "brlt 6f\n\t"                                                                                          \
    "ldi r24, 0x7F\n\t"                                                                                    \
    "rjmp 7f\n\t"                                                                                          \
    "6:\n\t"                                                                                               \
    "cpi r24, 0x81\n\t"                                                                                    \
    "ldi r21, 0xFF\n\t"                                                                                    \
    "cpc r25, r21\n\t"                                                                                     \
    "brge 7f\n\t"                                                                                          \
    "ldi r24, 0x81\n\t"                                                                                    \
    "7:\n\t"                                                                                               \
    "st X+, r24\n\t"                                                                                       \
    ".else\n\t"                                                                                            \
    "st X+, " a "\n\tst X+, " b "\n\tst X+, " c "\n\t"                                                     \
    ".endif\n\t"
#define TP_PROTONN_DENSE_GROUP_ASM(G, xp, wp, start, out)                                                       \
    __asm__ volatile(                                                                                      \
        TP_PROTONN_DENSE_INIT("r2", "r3", "r4")                                                                 \
        ".if %[g] > 1\n\t" TP_PROTONN_DENSE_INIT("r5", "r6", "r7") ".endif\n\t"                                 \
        ".if %[g] > 2\n\t" TP_PROTONN_DENSE_INIT("r8", "r9", "r10") ".endif\n\t"                                \
        ".if %[g] > 3\n\t" TP_PROTONN_DENSE_INIT("r11", "r12", "r13") ".endif\n\t"                              \
        "ldi r22, 0\n\t"                                                                                   \
        "ldi r23, 0x80\n\t"                                                                                \
        ".if %[steps]\n\t"                                                                                 \
        "ldi r24, %[steps]\n\t"                                                                            \
        "1:\n\t"                                                                                           \
        ".rept 8\n\t" TP_PROTONN_DENSE_INPUT ".endr\n\t"                                                        \
        "dec r24\n\t"                                                                                      \
        "breq 5f\n\t"                                                                                      \
        "rjmp 1b\n\t" /* brne reaches only 64 words */                                                     \
        "5:\n\t"                                                                                           \
        ".endif\n\t"                                                                                       \
        ".rept %[rest]\n\t" TP_PROTONN_DENSE_INPUT ".endr\n\t"                                                  \
        "movw r26, %[o]\n\t" TP_PROTONN_DENSE_STORE("r2", "r3", "r4")                                           \
        ".if %[g] > 1\n\t" TP_PROTONN_DENSE_STORE("r5", "r6", "r7") ".endif\n\t"                                \
        ".if %[g] > 2\n\t" TP_PROTONN_DENSE_STORE("r8", "r9", "r10") ".endif\n\t"                               \
        ".if %[g] > 3\n\t" TP_PROTONN_DENSE_STORE("r11", "r12", "r13") ".endif\n\t"                             \
        "clr __zero_reg__\n\t" TP_PROTONN_PAD                                                                   \
        : "+x"(xp), "+z"(wp)                                                                               \
        : [g] "n"(G), [steps] "n"(TP_N_FEATURES / 8), [rest] "n"(TP_N_FEATURES % 8), [start] "r"(start),  \
          [o] "r"(out), [zasm] "n"(TP_PROTONN_ROW_Z_ASM),                                                  \
          [k] "n"(TP_PROTONN_ROW_Z_ASM ? TP_PROTONN_PROJ_RSHIFT - 8 : 0)                                    \
        : "r0", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", "r11", "r12", "r13", "r20", "r21", \
          "r22", "r23", "r24", "r25", "memory")
#if TP_PROTONN_ROW_Z_ASM
#define TP_PROTONN_DENSE_START ((__uint24)(TP_PROTONN_HALF - (__uint24)((uint32_t)TP_N_FEATURES << 15)))
#else
#define TP_PROTONN_DENSE_START ((__uint24)0)
#endif
#if !TP_PROTONN_ROW_Z_ASM
/* z for a group's stored sums (the C rescale). */
static inline __attribute__((always_inline)) void tp_protonn_dense_rescale(const uint8_t *acc, int8_t *z, uint8_t r0,
                                                                       uint8_t g)
{
    (void)r0; /* the offset rescale's row */
    for (uint8_t c = 0; c < g; ++c, acc += 3) {
        __uint24 sum = (__uint24)acc[0] | ((__uint24)acc[1] << 8) | ((__uint24)acc[2] << 16);
        z[c] = TP_PROTONN_RESCALE(tp_protonn_unbias(sum, TP_N_FEATURES), (uint8_t)(r0 + c));
    }
}
#endif
#elif TP_PROTONN_ASM_ROWS
/* Sparse row: W's bitmap stream (tp_protonn_W_bitmap: per 8 inputs a bitmap byte, then its nonzeros) through Z, x
 * through Y (r28:r29, claimed by the asm and saved by the prologue) with a displacement. Per bitmap byte
 * lpm 3 + tst 1 + brne 2 (a zero byte: + 1 and it skips its 8 inputs at once); per bit sbrs + rjmp (3 cycles)
 * when clear, and when set sbrs 2 + ldd 2 + lpm 3 + muls 2 + biased 24-bit add 4 = 13 cycles. Rows of up to
 * 64 inputs are unrolled whole (ldd reaches Y+63: no pointer step, no byte counter); longer rows loop over
 * bytes, stepping Y by 8. Fixed scratch registers (clobbered, so gcc keeps nothing there and needs no frame
 * pointer): r18 bitmap byte, r19 byte counter, r20 x_i, r21 w, r22 zero, r23 0x80. */
#define TP_PROTONN_SPARSE_BYTE                                                                                  \
    "lpm r18, Z+\n\t"                                                                                      \
    "tst r18\n\t"                                                                                          \
    "brne 4f\n\t"                                                                                          \
    "rjmp 3f\n\t" /* breq/brne reach only 64 words */                                                      \
    "4:\n\t"                                                                                               \
    ".irp k,0,1,2,3,4,5,6,7\n\t"                                                                           \
    "sbrs r18, \\k\n\t"                                                                                    \
    "rjmp 2f\n\t"                                                                                          \
    "ldd r20, Y+tp_protonn_disp+\\k\n\t"                                                                        \
    "lpm r21, Z+\n\t"                                                                                      \
    "muls r21, r20\n\t"                                                                                    \
    "eor r1, r23\n\t"                                                                                      \
    "add %A[acc], r0\n\t"                                                                                  \
    "adc %B[acc], r1\n\t"                                                                                  \
    "adc %C[acc], r22\n\t"                                                                                 \
    "2:\n\t"                                                                                               \
    ".endr\n\t"                                                                                            \
    "3:\n\t"
/* Inlined into the row loop: the registers gcc must save for it are saved once per projection, not per row. */
#if TP_PROTONN_ROW_Z_ASM
typedef int8_t tp_protonn_row_t; /* the row kernel returns z_r itself */
#define TP_PROTONN_ACC_START TP_PROTONN_HALF
#else
typedef int32_t tp_protonn_row_t;
#define TP_PROTONN_ACC_START 0
#endif
static inline __attribute__((always_inline)) tp_protonn_row_t tp_protonn_row_dot(const int8_t *x,
                                                                                  const uint8_t **stream)
{
    const uint8_t *w = *stream;
    const uint8_t *first = w;
    __uint24 acc;
    __asm__ volatile(
        "ldi %A[acc], lo8(%[start])\n\t" /* the rounding half (or 0) */
        "ldi %B[acc], hi8(%[start])\n\t"
        "ldi %C[acc], hlo8(%[start])\n\t"
        "movw r28, %[x]\n\t"
        "ldi r22, 0\n\t"
        "ldi r23, 0x80\n\t"
#if TP_PROTONN_W_MASK_BYTES <= 8
        ".set tp_protonn_disp, 0\n\t"
        ".rept %[bytes]\n\t" TP_PROTONN_SPARSE_BYTE ".set tp_protonn_disp, tp_protonn_disp + 8\n\t"
        ".endr\n\t"
#else
        ".set tp_protonn_disp, 0\n\t"
        "ldi r19, %[bytes]\n\t"
        "1:\n\t" TP_PROTONN_SPARSE_BYTE
        "adiw r28, 8\n\t"
        "dec r19\n\t"
        "breq 5f\n\t"
        "rjmp 1b\n\t"
        "5:\n\t"
#endif
        "clr __zero_reg__\n\t" TP_PROTONN_PAD
        : [acc] "=&d"(acc), [w] "+z"(w)
        : [x] "r"(x), [bytes] "M"(TP_PROTONN_W_MASK_BYTES), [start] "i"((uint32_t)TP_PROTONN_ACC_START)
        : "r0", "r18", "r19", "r20", "r21", "r22", "r23", "r28", "r29", "memory");
    *stream = w;
#if TP_PROTONN_ROW_Z_ASM
    return tp_protonn_row_z(tp_protonn_drop_bias(acc, (uint16_t)(w - first - TP_PROTONN_W_MASK_BYTES)));
#else
    return tp_protonn_unbias(acc, (uint16_t)(w - first - TP_PROTONN_W_MASK_BYTES));
#endif
}
#endif

#if TP_PROTONN_ROWMAJOR && TP_PROTONN_ASM_ROWS
#define TP_PROTONN_AVR_PROJECT 1
TP_NOINLINE static void tp_protonn_project(const int8_t *x, int8_t *z)
{
#if TP_PROTONN_W_DENSE && TP_PROTONN_ASM_ROWS && TP_PROTONN_ROW_Z_ASM
    /* the group kernels store z themselves */
    const int8_t *w = tp_protonn_W;
    const __uint24 start = TP_PROTONN_DENSE_START;
#if TP_PROTONN_DIM >= 4
    for (uint8_t r0 = 0; r0 + 4 <= TP_PROTONN_DIM; r0 = (uint8_t)(r0 + 4)) {
        const int8_t *xp = x;
        TP_PROTONN_DENSE_GROUP_ASM(4, xp, w, start, z + r0);
    }
#endif
#if TP_PROTONN_DIM % 4
    {
        const int8_t *xp = x;
        TP_PROTONN_DENSE_GROUP_ASM(TP_PROTONN_DIM % 4, xp, w, start, z + (TP_PROTONN_DIM - TP_PROTONN_DIM % 4));
    }
#endif
#elif TP_PROTONN_W_DENSE && TP_PROTONN_ASM_ROWS
    const int8_t *w = tp_protonn_W;
    const __uint24 start = TP_PROTONN_DENSE_START;
    uint8_t acc[3 * 4];
#if TP_PROTONN_DIM >= 4
    for (uint8_t r0 = 0; r0 + 4 <= TP_PROTONN_DIM; r0 = (uint8_t)(r0 + 4)) {
        const int8_t *xp = x;
        TP_PROTONN_DENSE_GROUP_ASM(4, xp, w, start, acc);
        tp_protonn_dense_rescale(acc, z + r0, r0, 4);
    }
#endif
#if TP_PROTONN_DIM % 4
    {
        const int8_t *xp = x;
        TP_PROTONN_DENSE_GROUP_ASM(TP_PROTONN_DIM % 4, xp, w, start, acc);
        tp_protonn_dense_rescale(acc, z + (TP_PROTONN_DIM - TP_PROTONN_DIM % 4), TP_PROTONN_DIM - TP_PROTONN_DIM % 4,
                                 TP_PROTONN_DIM % 4);
    }
#endif
#else
    const uint8_t *stream = tp_protonn_W_bitmap;
    for (uint8_t r = 0; r < TP_PROTONN_DIM; ++r) {
#if TP_PROTONN_ROW_Z_ASM
        z[r] = tp_protonn_row_dot(x, &stream);
#else
        z[r] = TP_PROTONN_RESCALE(tp_protonn_row_dot(x, &stream), r);
#endif
    }
#endif
}
#endif

#define TP_PROTONN_AVR_KERNELS 1
/* kernel[j] for every prototype: the D terms |z_r - B[j,r]|^2 of a prototype are unrolled (4 per loop step
 * above 64 dimensions). Per term: ld 2 + lpm 3 + sub 1 + (brge 2 | brge 1 + neg 1) + mul 2 + 24-bit add 3 =
 * 13 cycles. sub sets S = N ^ V, the sign of the true 9-bit difference, so neg gives |z - b| <= 255. */
#define TP_PROTONN_DIST_TERM                                                                                    \
    "ld %[t], %a[zp]+\n\t"                                                                                 \
    "lpm %[b], Z+\n\t"                                                                                     \
    "sub %[t], %[b]\n\t"                                                                                   \
    "brge 4f\n\t"                                                                                          \
    "neg %[t]\n\t"                                                                                         \
    "4:\n\t"                                                                                               \
    "mul %[t], %[t]\n\t"                                                                                   \
    "add %A[d], r0\n\t"                                                                                    \
    "adc %B[d], r1\n\t"                                                                                    \
    "adc %C[d], %[zero]\n\t"
#if TP_PROTONN_DIM > 64
#define TP_PROTONN_DIST_STEPS (TP_PROTONN_DIM / 4)
#define TP_PROTONN_DIST_REST (TP_PROTONN_DIM % 4)
#else
#define TP_PROTONN_DIST_STEPS 0
#define TP_PROTONN_DIST_REST TP_PROTONN_DIM
#endif
#define TP_PROTONN_TABLE_REACH ((uint32_t)(TP_PROTONN_TABLE_SIZE - 1) << TP_PROTONN_TABLE_SHIFT)
/* kernel value of one prototype (inlined into the prototype loop; see TP_PROTONN_PAD). */
static inline __attribute__((always_inline)) uint8_t tp_protonn_proto_kernel(const int8_t *zp, const int8_t *proto)
{
    __uint24 dist = 0;
    uint8_t t, b, zero = 0;
#if TP_PROTONN_DIST_STEPS
    uint8_t n = TP_PROTONN_DIST_STEPS;
#endif
    __asm__ volatile(
#if TP_PROTONN_DIST_STEPS
        "5:\n\t"
        ".rept 4\n\t" TP_PROTONN_DIST_TERM ".endr\n\t"
        "dec %[n]\n\t"
        "brne 5b\n\t"
#endif
        ".rept %[rest]\n\t" TP_PROTONN_DIST_TERM ".endr\n\t"
        "clr __zero_reg__\n\t" TP_PROTONN_PAD
        : [d] "+r"(dist), [zp] "+e"(zp), [bp] "+z"(proto), [t] "=&r"(t), [b] "=&r"(b)
#if TP_PROTONN_DIST_STEPS
          , [n] "+r"(n)
#endif
        : [zero] "r"(zero), [rest] "n"(TP_PROTONN_DIST_REST)
        : "r0", "memory");
    uint8_t index;
#if ((TP_PROTONN_TABLE_SIZE - 1) << TP_PROTONN_TABLE_SHIFT) <= 0xFFFF
    /* reach <= 0xFFFF: the index of a distance within reach from the distance's low bytes, always computed, then
     * clamped to the last entry without a branch whose time depends on the distance (the time, and the cost
     * model's count, is the same for every input). Within reach dist << (8 - SHIFT) < (SIZE - 1) << 8 fits 16
     * bits, so the index is a short left shift and the high byte (or the middle byte shifted right by SHIFT - 8);
     * beyond reach it is garbage, which the clamp replaces. */
#if TP_PROTONN_TABLE_SHIFT >= 8
    index = (uint8_t)((uint16_t)dist >> 8);
    __asm__(".rept %[k]\n\tlsr %0\n\t.endr" : "+r"(index) : [k] "n"(TP_PROTONN_TABLE_SHIFT - 8));
#else
    uint16_t low = (uint16_t)dist;
    __asm__(".rept %[k]\n\tlsl %A0\n\trol %B0\n\t.endr" : "+r"(low) : [k] "n"(8 - TP_PROTONN_TABLE_SHIFT));
    index = (uint8_t)(low >> 8);
#endif
    {
        uint8_t beyond;
        /* beyond = 0xFF when dist >= reach (24-bit compare, borrow into sbc), else 0; the index ORed with it and
         * limited to SIZE - 1: brlo taken (2 cycles) or not taken and ldi (1 + 1), the same either way. */
        __asm__("ldi %[t], lo8(%[reach])\n\t"
                "cp %A[d], %[t]\n\t"
                "ldi %[t], hi8(%[reach])\n\t"
                "cpc %B[d], %[t]\n\t"
                "cpc %C[d], __zero_reg__\n\t"
                "sbc %[t], %[t]\n\t"
                "com %[t]\n\t"
                "or %[i], %[t]\n\t"
                "cpi %[i], %[last]\n\t"
                "brlo 1f\n\t"
                "ldi %[i], %[last]\n\t"
                "1:"
                : [i] "+d"(index), [t] "=&d"(beyond)
                : [d] "r"(dist), [reach] "i"(TP_PROTONN_TABLE_REACH), [last] "n"(TP_PROTONN_TABLE_SIZE - 1));
    }
#else
    /* reach > 0xFFFF (SHIFT >= 9, as SIZE <= 256): dist >> SHIFT from whole bytes and a short shift (not
     * tp_protonn_table_index's 32-bit shift loop), always computed, then clamped in constant time, so the time does
     * not depend on the distance (the cost model's count is exact). */
#if TP_PROTONN_TABLE_SHIFT >= 24
    uint16_t wide = 0; /* dist < 2^24 */
    (void)dist;
#elif TP_PROTONN_TABLE_SHIFT >= 16
    uint8_t high = (uint8_t)(dist >> 16);
    __asm__(".rept %[k]\n\tlsr %0\n\t.endr" : "+r"(high) : [k] "n"(TP_PROTONN_TABLE_SHIFT - 16));
    uint16_t wide = high;
#else
    /* a .rept of lsr/ror: 2 cycles a bit (avr-gcc turns some 16-bit shifts into loops) */
    uint16_t wide = (uint16_t)(dist >> 8);
    __asm__(".rept %[k]\n\tlsr %B0\n\tror %A0\n\t.endr" : "+r"(wide) : [k] "n"(TP_PROTONN_TABLE_SHIFT - 8));
#endif
    /* min(wide, SIZE - 1) without a branch whose time depends on the distance: brlo taken (2 cycles) or not
     * taken and ldi (1 + 1) */
    index = (uint8_t)wide;
    __asm__("cpi %[i], %[last]\n\t"
            "cpc %[h], __zero_reg__\n\t"
            "brlo 1f\n\t"
            "ldi %[i], %[last]\n\t"
            "1:"
            : [i] "+d"(index)
            : [h] "r"((uint8_t)(wide >> 8)), [last] "n"(TP_PROTONN_TABLE_SIZE - 1));
#endif
    return tp_read_u8(&tp_protonn_kernel[index]);
}

#if TP_PROTONN_DIM <= 16 && TP_PROTONN_TABLE_SIZE <= 256 && \
    ((TP_PROTONN_TABLE_SIZE - 1) << TP_PROTONN_TABLE_SHIFT) <= 0xFFFF
/* D <= 16: the whole prototype loop in one asm block with z held in r2..r(D+1), so a term is
 *   lpm t, Z+ (3); sub t, z_r (1); brge/neg (2); mul t, t (2); 24-bit add (3) = 11 cycles
 * ((b - z)^2 = (z - b)^2; sub's S flag is the sign of the true difference, as above; the first term sets the
 * sum with movw + clr instead of clearing and adding), then the table index min(dist >> SHIFT, SIZE - 1) as a
 * compare with the table's reach (its high bytes only when its low byte is 0) and a short shift, the lookup,
 * and the running sum of the kernel values the scores' bias needs. Registers: r18:r19:r20 dist, r21 t, r22
 * zero, r23 scratch, r24 prototype counter, r25 the reach's high byte, X z then the kernel sum, Y kernel out,
 * Z B (saved in r0:r1 during the lookup). */
#if TP_PROTONN_DIM == 1
#define TP_PROTONN_ZREGS "r2"
#elif TP_PROTONN_DIM == 2
#define TP_PROTONN_ZREGS "r2,r3"
#define TP_PROTONN_ZREST "r3"
#elif TP_PROTONN_DIM == 3
#define TP_PROTONN_ZREGS "r2,r3,r4"
#define TP_PROTONN_ZREST "r3,r4"
#elif TP_PROTONN_DIM == 4
#define TP_PROTONN_ZREGS "r2,r3,r4,r5"
#define TP_PROTONN_ZREST "r3,r4,r5"
#elif TP_PROTONN_DIM == 5
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6"
#define TP_PROTONN_ZREST "r3,r4,r5,r6"
#elif TP_PROTONN_DIM == 6
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7"
#elif TP_PROTONN_DIM == 7
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7,r8"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7,r8"
#elif TP_PROTONN_DIM == 8
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7,r8,r9"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7,r8,r9"
#elif TP_PROTONN_DIM == 9
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7,r8,r9,r10"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7,r8,r9,r10"
#elif TP_PROTONN_DIM == 10
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7,r8,r9,r10,r11"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7,r8,r9,r10,r11"
#elif TP_PROTONN_DIM == 11
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7,r8,r9,r10,r11,r12"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7,r8,r9,r10,r11,r12"
#elif TP_PROTONN_DIM == 12
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13"
#elif TP_PROTONN_DIM == 13
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14"
#elif TP_PROTONN_DIM == 14
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14,r15"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14,r15"
#elif TP_PROTONN_DIM == 15
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14,r15,r16"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14,r15,r16"
#elif TP_PROTONN_DIM == 16
#define TP_PROTONN_ZREGS "r2,r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14,r15,r16,r17"
#define TP_PROTONN_ZREST "r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14,r15,r16,r17"
#endif
#if TP_PROTONN_TABLE_SHIFT >= 8
#define TP_PROTONN_INDEX_SHIFT "mov r23, r19\n\t.rept %[shift] - 8\n\tlsr r23\n\t.endr\n\t"
#else
#define TP_PROTONN_INDEX_SHIFT ".rept 8 - %[shift]\n\tlsl r18\n\trol r19\n\t.endr\n\tmov r23, r19\n\t"
#endif
#define TP_PROTONN_REACH ((TP_PROTONN_TABLE_SIZE - 1) << TP_PROTONN_TABLE_SHIFT)
#if (TP_PROTONN_REACH & 0xFF) == 0
#define TP_PROTONN_REACH_CMP "cpi r19, hi8(%[reach])\n\t"
#else
#define TP_PROTONN_REACH_CMP "cpi r18, lo8(%[reach])\n\tcpc r19, r25\n\t"
#endif
TP_NOINLINE static uint16_t tp_protonn_kernels(const int8_t *z, uint8_t *kernel)
{
    const int8_t *proto = tp_protonn_B;
    uint16_t xreg = (uint16_t)z; /* X: z, then the kernel sum */
    __asm__ volatile(
        ".irp reg, " TP_PROTONN_ZREGS "\n\t"
        "ld \\reg, X+\n\t"
        ".endr\n\t"
        "clr r26\n\t"
        "clr r27\n\t"
        "ldi r22, 0\n\t"
        "ldi r25, hi8(%[reach])\n\t"
        "ldi r24, lo8(%[protos])\n\t"
        "1:\n\t"
        "lpm r21, Z+\n\t"
        "sub r21, r2\n\t"
        "brge 2f\n\t"
        "neg r21\n\t"
        "2:\n\t"
        "mul r21, r21\n\t"
        "movw r18, r0\n\t"
        "clr r20\n\t"
#if TP_PROTONN_DIM > 1
        ".irp reg, " TP_PROTONN_ZREST "\n\t"
        "lpm r21, Z+\n\t"
        "sub r21, \\reg\n\t"
        "brge 2f\n\t"
        "neg r21\n\t"
        "2:\n\t"
        "mul r21, r21\n\t"
        "add r18, r0\n\t"
        "adc r19, r1\n\t"
        "adc r20, r22\n\t"
        ".endr\n\t"
#endif
        TP_PROTONN_REACH_CMP
        "cpc r20, r22\n\t"
        "brsh 3f\n\t"
        TP_PROTONN_INDEX_SHIFT
        "rjmp 4f\n\t"
        "3:\n\t"
        "ldi r23, %[last]\n\t"
        "4:\n\t"
        "movw r0, r30\n\t"
        "ldi r30, lo8(%[table])\n\t"
        "ldi r31, hi8(%[table])\n\t"
        "add r30, r23\n\t"
        "adc r31, r22\n\t"
        "lpm r23, Z\n\t"
        "st Y+, r23\n\t"
        "add r26, r23\n\t"
        "adc r27, r22\n\t"
        "movw r30, r0\n\t"
        "dec r24\n\t"
        "breq 5f\n\t"
        "rjmp 1b\n\t" /* brne reaches only 64 words */
        "5:\n\t"
        "clr __zero_reg__\n\t"
        : "+x"(xreg), "+y"(kernel), "+z"(proto)
        : [protos] "i"(TP_PROTONN_PROTOS), [reach] "i"(TP_PROTONN_REACH),
          [shift] "i"(TP_PROTONN_TABLE_SHIFT), [last] "i"(TP_PROTONN_TABLE_SIZE - 1), [table] "i"(tp_protonn_kernel)
        : "r0", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "r16",
          "r17", "r18", "r19", "r20", "r21", "r22", "r23", "r24", "r25", "memory");
    return xreg;
}
#else
TP_NOINLINE static uint16_t tp_protonn_kernels(const int8_t *z, uint8_t *kernel)
{
    const int8_t *proto = tp_protonn_B;
    tp_protonn_proto_index_t j = 0;
    uint16_t sum = 0;
    do {
        uint8_t k = tp_protonn_proto_kernel(z, proto);
        kernel[j] = k;
        sum += k;
        proto += TP_PROTONN_DIM;
    } while (++j != TP_PROTONN_PROTOS);
    return sum;
}
#endif

/* Scores, a group of G <= 5 classes at a time (tp_protonn_Z: Z + 128 as uint8, the group's G values of prototype j
 * together, see quantize.score_layout): per prototype one ld of k_j (2) serves G products, each lpm 3 + mul 2
 * + 24-bit add 3 = 8 cycles, so 8 + 2 / G per term; 8 prototypes per loop step, then the remainder. The group's
 * sums sit in r2..r16 (class g in r(2+3g)..r(4+3g)), r17 counts the steps; s_l = sum_j (Z + 128) k_j
 * - 128 sum_j k_j, taken modulo
 * 2^24 (the biased sum is <= 255 * 255 * m < 2^24 for m <= 256, and |s_l| <= 128 * 255 * m < 2^23) and
 * sign-extended into scores[l]. */
#define TP_PROTONN_SCORE_CLASS(a, b, c)                                                                         \
    "lpm r21, Z+\n\t"                                                                                      \
    "mul r21, r23\n\t"                                                                                     \
    "add " a ", r0\n\t"                                                                                    \
    "adc " b ", r1\n\t"                                                                                    \
    "adc " c ", r22\n\t"
#define TP_PROTONN_SCORE_PROTO                                                                                  \
    "ld r23, X+\n\t" TP_PROTONN_SCORE_CLASS("r2", "r3", "r4")                                                   \
    ".if %[g] > 1\n\t" TP_PROTONN_SCORE_CLASS("r5", "r6", "r7") ".endif\n\t"                                    \
    ".if %[g] > 2\n\t" TP_PROTONN_SCORE_CLASS("r8", "r9", "r10") ".endif\n\t"                                   \
    ".if %[g] > 3\n\t" TP_PROTONN_SCORE_CLASS("r11", "r12", "r13") ".endif\n\t"                                \
    ".if %[g] > 4\n\t" TP_PROTONN_SCORE_CLASS("r14", "r15", "r16") ".endif\n\t"
#define TP_PROTONN_SCORE_STORE(a, b, c)                                                                         \
    "sub " a ", %A[bias]\n\t"                                                                              \
    "sbc " b ", %B[bias]\n\t"                                                                              \
    "sbc " c ", %C[bias]\n\t"                                                                              \
    "clr r23\n\t"                                                                                          \
    "sbrc " c ", 7\n\t"                                                                                    \
    "com r23\n\t"                                                                                          \
    "st X+, " a "\n\t"                                                                                     \
    "st X+, " b "\n\t"                                                                                     \
    "st X+, " c "\n\t"                                                                                     \
    "st X+, r23\n\t"
#define TP_PROTONN_SCORE_GROUP_ASM(G, zp, kp, bias, out)                                                        \
    __asm__ volatile(                                                                                      \
        ".irp reg,r2,r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14,r15,r16\n\t"                                 \
        "clr \\reg\n\t"                                                                                    \
        ".endr\n\t"                                                                                        \
        "ldi r22, 0\n\t"                                                                                   \
        ".if %[steps]\n\t"                                                                                 \
        "ldi r17, %[steps]\n\t"                                                                            \
        "1:\n\t"                                                                                           \
        ".rept 8\n\t" TP_PROTONN_SCORE_PROTO ".endr\n\t"                                                        \
        "dec r17\n\t"                                                                                      \
        "breq 5f\n\t"                                                                                      \
        "rjmp 1b\n\t"                                                                                      \
        "5:\n\t"                                                                                           \
        ".endif\n\t"                                                                                       \
        ".rept %[rest]\n\t" TP_PROTONN_SCORE_PROTO ".endr\n\t"                                                  \
        "movw r26, %[o]\n\t" TP_PROTONN_SCORE_STORE("r2", "r3", "r4")                                           \
        ".if %[g] > 1\n\t" TP_PROTONN_SCORE_STORE("r5", "r6", "r7") ".endif\n\t"                                \
        ".if %[g] > 2\n\t" TP_PROTONN_SCORE_STORE("r8", "r9", "r10") ".endif\n\t"                               \
        ".if %[g] > 3\n\t" TP_PROTONN_SCORE_STORE("r11", "r12", "r13") ".endif\n\t"                             \
        ".if %[g] > 4\n\t" TP_PROTONN_SCORE_STORE("r14", "r15", "r16") ".endif\n\t"                             \
        "clr __zero_reg__\n\t" TP_PROTONN_PAD                                                                   \
        : "+x"(kp), "+z"(zp)                                                                               \
        : [g] "n"(G), [steps] "n"(TP_PROTONN_PROTOS / 8), [rest] "n"(TP_PROTONN_PROTOS % 8), [bias] "r"(bias),       \
          [o] "r"(out)                                                                                     \
        : "r0", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", \
          "r16", "r17", "r21", "r22", "r23", "memory")

static void tp_protonn_all_scores(const uint8_t *kernel, uint16_t kernel_sum, int32_t *scores)
{
    const uint8_t *zp = tp_protonn_Z;
    __uint24 bias = (__uint24)kernel_sum << 7; /* 128 sum_j k_j <= 128 * 255 * 256 < 2^24 */
#if TP_N_CLASSES >= TP_PROTONN_SCORE_GROUP
    for (uint8_t l = 0; l + TP_PROTONN_SCORE_GROUP <= TP_N_CLASSES; l += TP_PROTONN_SCORE_GROUP) {
        const uint8_t *kp = kernel;
        TP_PROTONN_SCORE_GROUP_ASM(TP_PROTONN_SCORE_GROUP, zp, kp, bias, scores + l);
    }
#endif
#if TP_N_CLASSES % TP_PROTONN_SCORE_GROUP
    {
        const uint8_t *kp = kernel;
        TP_PROTONN_SCORE_GROUP_ASM(TP_N_CLASSES % TP_PROTONN_SCORE_GROUP, zp, kp, bias,
                              scores + (TP_N_CLASSES - TP_N_CLASSES % TP_PROTONN_SCORE_GROUP));
    }
#endif
}
#endif /* TP_PROTONN_ASM */
