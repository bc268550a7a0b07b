/* tp_judge's AVR twin: the optimised twin of tp_judge.c's portable reference, included by tp_judge.c when
 * tinyproto.h chooses the AVR kernels (TP_KERNELS_AVR; -DTP_FORCE_REFERENCE keeps the reference there too). The
 * same steps in assembly, a third of the flash avr-gcc -Os gives the C (the stage is meant to cost at most 64 B);
 * tests/test_confidence.py runs both against the host reference (core/confidence.py, Calibration.judge). */

/* The AVR twin: avr-gcc's calling convention (scores r25:r24, label r22, confidence r21:r20, answer r24), only
 * call-clobbered registers, no frame. Z walks the scores, X holds each view, r19:r18 the runner-up's, r25:r24
 * the winner's; r23 is the class index, then the doubt. The winner's branch sits after the return: it takes
 * the view and, with a limit, compares it (cpi + sbci on the view's copy, which the next load overwrites) and
 * marks a decline by setting the label to 255, which no class index equals.
 * Up to 16 classes the pass runs backwards, last class first (the runner-up's view does not depend on the order):
 * the last view is within ldd's reach of the scores' address (63 B), and a count down to 0 ends on the borrow,
 * one instruction less than a count up to N. */
#define TP_JUDGE_STR_(x) #x
#define TP_JUDGE_STR(x) TP_JUDGE_STR_(x)
#if 4 * (TP_N_CLASSES - 1) + TP_JUDGE_SCORE_BYTE + 1 <= 63
#define TP_JUDGE_FIRST TP_JUDGE_STR(TP_N_CLASSES - 1)                     /* the class index starts at the last */
#define TP_JUDGE_B TP_JUDGE_STR(4 * (TP_N_CLASSES - 1) + TP_JUDGE_SCORE_BYTE)
#define TP_JUDGE_STEP "sbiw r30, 4\n\t"
#define TP_JUDGE_NEXT "subi r23, 1\n\tbrcc 1b\n\t"
#else
#define TP_JUDGE_FIRST "0"
#define TP_JUDGE_B TP_JUDGE_STR(TP_JUDGE_SCORE_BYTE)
#define TP_JUDGE_STEP "adiw r30, 4\n\t"
#define TP_JUDGE_NEXT "inc r23\n\tcpi r23, " TP_JUDGE_STR(TP_N_CLASSES) "\n\tbrne 1b\n\t"
#endif
#if TP_SCORE_LOWEST_WINS
#define TP_JUDGE_WORST "0x7fff"
#define TP_JUDGE_KEEP "cp r26, r18\n\tcpc r27, r19\n\t"                       /* s - runner: s >= runner keeps */
#define TP_JUDGE_MARGIN "sub r18, r24\n\tsbc r19, r25\n\t"                     /* runner - winner, in r19:r18 */
#define TP_JUDGE_M_LO "r18"
#define TP_JUDGE_M_HI "r19"
#ifdef TP_UNKNOWN_LIMIT /* declined when the winner > limit: accepted when winner - (limit + 1) < 0 */
#define TP_JUDGE_CMP "cpi r26, lo8(" TP_JUDGE_STR(TP_UNKNOWN_LIMIT) " + 1)\n\t" \
                     "sbci r27, hi8(" TP_JUDGE_STR(TP_UNKNOWN_LIMIT) " + 1)\n\t"
#define TP_JUDGE_ACCEPT "brlt "
#define TP_JUDGE_DECLINE "brge "
#endif
#else
#define TP_JUDGE_WORST "0x8000"
#define TP_JUDGE_KEEP "cp r18, r26\n\tcpc r19, r27\n\t"                       /* runner - s: runner >= s keeps */
#define TP_JUDGE_MARGIN "sub r24, r18\n\tsbc r25, r19\n\t"                     /* winner - runner, in r25:r24 */
#define TP_JUDGE_M_LO "r24"
#define TP_JUDGE_M_HI "r25"
#ifdef TP_UNKNOWN_LIMIT /* declined when the winner < limit: accepted when winner - limit >= 0 */
#define TP_JUDGE_CMP "cpi r26, lo8(" TP_JUDGE_STR(TP_UNKNOWN_LIMIT) ")\n\t" \
                     "sbci r27, hi8(" TP_JUDGE_STR(TP_UNKNOWN_LIMIT) ")\n\t"
#define TP_JUDGE_ACCEPT "brge "
#define TP_JUDGE_DECLINE "brlt "
#endif
#endif
/* A family's range check and the clip check (tp_judge.c): a limit passed, each byte below its bound accepts (the
 * last one's brlo back into the pass); a limit failed, or a byte at or above its bound, reaches the same decline
 * (label 255). r26 is free there: the next load overwrites it. */
#ifdef TP_UNKNOWN_RANGE_LOW
#define TP_JUDGE_RANGE_LOAD "lds r26, " TP_JUDGE_STR(tp_range_signal) "\n\tcpi r26, " TP_JUDGE_STR(TP_UNKNOWN_RANGE_BINS) "\n\t"
#endif
#ifdef TP_UNKNOWN_CLIPS
#define TP_JUDGE_CLIP_LOAD "lds r26, " TP_JUDGE_STR(tp_clip_count) "\n\tcpi r26, " TP_JUDGE_STR(TP_UNKNOWN_CLIPS) " + 1\n\t"
#endif
#if defined(TP_UNKNOWN_RANGE_LOW) && defined(TP_UNKNOWN_CLIPS)
#define TP_JUDGE_CHECKS TP_JUDGE_RANGE_LOAD "brsh 7f\n\t" TP_JUDGE_CLIP_LOAD "brlo 3b\n"
#elif defined(TP_UNKNOWN_RANGE_LOW)
#define TP_JUDGE_CHECKS TP_JUDGE_RANGE_LOAD "brlo 3b\n"
#elif defined(TP_UNKNOWN_CLIPS)
#define TP_JUDGE_CHECKS TP_JUDGE_CLIP_LOAD "brlo 3b\n"
#endif
#ifdef TP_JUDGE_CHECKS
#define TP_JUDGE_LIMIT TP_JUDGE_CMP TP_JUDGE_DECLINE "7f\n\t" TP_JUDGE_CHECKS "7:\n\tldi r22, 255\n\t"
#elif defined(TP_UNKNOWN_LIMIT)
#define TP_JUDGE_LIMIT TP_JUDGE_CMP TP_JUDGE_ACCEPT "3b\n\tldi r22, 255\n\t"
#else
#define TP_JUDGE_LIMIT ""
#endif

/* A function of file-scope assembly (a naked C function would defeat -fstack-usage, which the exported library's
 * cost uses): in a section of its own, so the linker drops it when nothing calls it, like -ffunction-sections.
 * The name is tp_judge's after the model's prefix (tinyproto_model.h: e.g. digits_judge). It uses no stack. */
#define TP_JUDGE_NAME TP_JUDGE_STR(tp_judge)
__asm__(
        ".pushsection .text." TP_JUDGE_NAME ",\"ax\",@progbits\n\t"
        ".global " TP_JUDGE_NAME "\n\t"
        ".type " TP_JUDGE_NAME ", @function\n"
        TP_JUDGE_NAME ":\n\t"
        "movw r30, r24\n\t"
        "ldi r23, " TP_JUDGE_FIRST "\n\t"
        "ldi r18, lo8(" TP_JUDGE_WORST ")\n\t"
        "ldi r19, hi8(" TP_JUDGE_WORST ")\n"
        "1:\n\t"
        "ldd r26, Z+" TP_JUDGE_B "\n\t"
        "ldd r27, Z+" TP_JUDGE_B "+1\n\t"
        TP_JUDGE_STEP
        "cp r23, r22\n\t"
        "breq 4f\n\t"
        TP_JUDGE_KEEP
        "brge 3f\n\t"
        "movw r18, r26\n"
        "3:\n\t"
        TP_JUDGE_NEXT
        TP_JUDGE_MARGIN
        "ldi r23, " TP_JUDGE_STR(TP_JUDGE_DOUBT) "\n"
        "5:\n\t"
        "subi " TP_JUDGE_M_LO ", lo8(" TP_JUDGE_STR(TP_JUDGE_HALVING) ")\n\t"
        "sbci " TP_JUDGE_M_HI ", hi8(" TP_JUDGE_STR(TP_JUDGE_HALVING) ")\n\t"
        "brcs 6f\n\t"
        "lsr r23\n\t"
        "brne 5b\n"
        "6:\n\t"
        "com r23\n\t"
        "movw r30, r20\n\t"
        "st Z, r23\n\t"
        "mov r24, r22\n\t"
        "ret\n"
        "4:\n\t"
        "movw r24, r26\n\t"
        TP_JUDGE_LIMIT
        "rjmp 3b\n\t"
        ".size " TP_JUDGE_NAME ", .-" TP_JUDGE_NAME "\n\t"
        ".popsection\n");


#ifdef TP_UNKNOWN_CLIPS
/* tp_judge_inputs' AVR twin (x r25:r24, first r23:r22, n r21:r20): the count so far, or 0 when first == 0, then
 * per input ld, subi, cpi (carry: clipped), adc and sbc of the carry, which add 1 and take it back at 255 (the
 * byte stops there), and the count of n down to the borrow: 10 cycles an input, 36 B. */
#define TP_JUDGE_INPUTS_NAME TP_JUDGE_STR(tp_judge_inputs)
__asm__(
        ".pushsection .text." TP_JUDGE_INPUTS_NAME ",\"ax\",@progbits\n\t"
        ".global " TP_JUDGE_INPUTS_NAME "\n\t"
        ".type " TP_JUDGE_INPUTS_NAME ", @function\n"
        TP_JUDGE_INPUTS_NAME ":\n\t"
        "movw r30, r24\n\t"
        "lds r18, " TP_JUDGE_STR(tp_clip_count) "\n\t"
        "or r22, r23\n\t"
        "brne 3f\n\t"
        "clr r18\n\t"
        "rjmp 3f\n"
        "1:\n\t"
        "ld r24, Z+\n\t"
        "subi r24, " TP_JUDGE_STR(TP_UNKNOWN_CLIP_FROM) "\n\t"
        "cpi r24, " TP_JUDGE_STR(TP_UNKNOWN_CLIP_SPAN) "\n\t"
        "adc r18, __zero_reg__\n\t"
        "sbc r18, __zero_reg__\n"
        "3:\n\t"
        "subi r20, 1\n\t"
        "sbci r21, 0\n\t"
        "brcc 1b\n\t"
        "sts " TP_JUDGE_STR(tp_clip_count) ", r18\n\t"
        "ret\n\t"
        ".size " TP_JUDGE_INPUTS_NAME ", .-" TP_JUDGE_INPUTS_NAME "\n\t"
        ".popsection\n");
#endif
