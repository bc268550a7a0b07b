/* tinyproto device application, measurement: Timer1 cycles around the model's code (between GPIOR0 markers the
 * simulator logs, so validation cross-checks both), the painted stack high-water mark, and .data + .bss. */
#include "tp_app.h"

/* ---- cycles: Timer1 at clk/1 around one call only ---------------------------------------------------------- */
#if defined(__AVR__)
#include <avr/interrupt.h>
#include <avr/io.h>

static volatile uint16_t tp_t1_overflows;
static uint16_t tp_overhead; /* cycles an empty call measures; subtracted from every figure */

ISR(TIMER1_OVF_vect)
{
    ++tp_t1_overflows;
}

static uint8_t tp_empty_predict(const int8_t *x, int32_t *scores)
{
    (void)x;
    (void)scores;
    return 0;
}

/* One code path for the calibration and the real call (the target comes in as a pointer, noclone keeps gcc
 * from specialising it), so their overheads are identical and cancel. */
__attribute__((noinline, noclone)) static uint32_t tp_timed(tp_predict_fn fn, const int8_t *x, int32_t *scores,
                                                            uint8_t *label, uint8_t mark)
{
    tp_t1_overflows = 0;
    TCNT1 = 0;
    TIFR1 = _BV(TOV1);
    TCCR1B = _BV(CS10);
    GPIOR0 = mark;
    uint8_t result = fn(x, scores);
    /* Interrupts off BEFORE the end marker: an overflow interrupt serviced between the marker and the read of
     * TCNT1 would add its ~40 cycles to Timer1's figure but not to the marker span (validate found the two
     * 40 cycles apart whenever an inference ended within a few cycles after an overflow). cli costs the same
     * cycle in the calibration call, so it cancels. Read the counter while it runs (simavr reads a stopped
     * Timer1 as 0). An overflow whose interrupt has not run shows as TOV1 set with a small count; a TOV1 set
     * after reading a large count is not ours. */
    cli();
    GPIOR0 = (uint8_t)(mark + 1u);
    uint16_t count = TCNT1;
    uint16_t overflows = tp_t1_overflows;
    if ((TIFR1 & _BV(TOV1)) && count < 0x8000u) {
        ++overflows;
    }
    TCCR1B = 0;
    TIFR1 = _BV(TOV1);
    sei();
    *label = result;
    return ((uint32_t)overflows << 16) | count;
}

void tp_timer_init(void)
{
    TCCR1A = 0;
    TCCR1B = 0;
    TIMSK1 = _BV(TOIE1);
    sei();
    uint8_t unused;
    tp_overhead = (uint16_t)tp_timed(tp_empty_predict, 0, 0, &unused, TP_MARK_CALIBRATE);
}

uint32_t tp_time_call(tp_predict_fn fn, const int8_t *x, int32_t *scores, uint8_t *label, uint8_t mark)
{
    uint32_t cycles = tp_timed(fn, x, scores, label, mark);
    return cycles > tp_overhead ? cycles - tp_overhead : 0;
}

#else /* host: no cycle counter */
void tp_timer_init(void)
{
}

uint32_t tp_time_call(tp_predict_fn fn, const int8_t *x, int32_t *scores, uint8_t *label, uint8_t mark)
{
    (void)mark;
    *label = fn(x, scores);
    return 0;
}
#endif

/* ---- SRAM figures: painted stack high-water mark and .data + .bss ---------------------------------------- */
#if defined(__AVR__)
#define TP_STACK_PAINT 0xC5

extern uint8_t __heap_start; /* first byte after .data, .bss and .noinit: free RAM up to the stack */
extern uint8_t __data_start;
extern uint8_t __bss_end;

/* Runs in .init3: the stack pointer is set, .data/.bss are not yet initialised and nothing lives above
 * __heap_start, so every byte from there to RAMEND is painted. Plain asm: a naked function must not rely on
 * the compiler keeping its locals out of a (non-existent) stack frame. */
void tp_stack_paint(void) __attribute__((naked, used, section(".init3")));
void tp_stack_paint(void)
{
    __asm__ volatile("    ldi r30, lo8(__heap_start)\n"
                     "    ldi r31, hi8(__heap_start)\n"
                     "    ldi r24, %0\n"
                     "    ldi r25, hi8(%1)\n"
                     "1:  st Z+, r24\n"
                     "    cpi r30, lo8(%1)\n"
                     "    cpc r31, r25\n"
                     "    brne 1b\n"
                     :
                     : "M"(TP_STACK_PAINT), "i"(RAMEND + 1)
                     : "r24", "r25", "r30", "r31", "memory");
}

/* Bytes of stack ever used: from RAMEND down to the lowest byte that lost its paint. */
uint16_t tp_stack_peak(void)
{
    const volatile uint8_t *p = (const volatile uint8_t *)&__heap_start;
    while (p <= (const volatile uint8_t *)RAMEND && *p == TP_STACK_PAINT) {
        ++p;
    }
    return (uint16_t)(RAMEND + 1u - (uint16_t)(uintptr_t)p);
}

uint16_t tp_static_sram(void)
{
    return (uint16_t)((uintptr_t)&__bss_end - (uintptr_t)&__data_start);
}
#else
uint16_t tp_stack_peak(void)
{
    return 0;
}

uint16_t tp_static_sram(void)
{
    return 0;
}
#endif
