/* tinyproto device application, transport: the serial port (USART registers or stdio), the one frame buffer
 * and the replies built in it. Frames themselves (COBS, CRC-16) are tp_serial.c's. */
#include "tp_app.h"

tp_buf_t tp_buf;
tp_parser_t tp_rx;
uint16_t tp_frames_bad;

#if defined(__AVR__)
#include <avr/interrupt.h>
#include <avr/io.h>
#include <avr/sleep.h>

#ifndef F_CPU
#define F_CPU 16000000UL
#endif
#ifndef TP_BAUD
#define TP_BAUD 115200UL
#endif
/* U2X: the board's baud (boards/<name>.json serial_baud) divides the clock exactly: 1,000,000 at 16 MHz is
 * UBRR 1, 500,000 at 16 MHz UBRR 3 or at 8 MHz UBRR 1. The fallback 115200 is UBRR 16 at 16 MHz (+2.1 %). */
#define TP_UBRR ((F_CPU + 4UL * TP_BAUD) / (8UL * TP_BAUD) - 1UL)

/* The protocol's USART: USART0 (ATmega328P; the ATmega2560's USART0 has the same registers), or USART1 on a
 * chip without USART0 (ATmega32U4: the Leonardo's Serial1 on pins 0/1; its USB port is not used). */
#if defined(UDR0)
#define TP_UBRRH UBRR0H
#define TP_UBRRL UBRR0L
#define TP_UCSRA UCSR0A
#define TP_UCSRB UCSR0B
#define TP_UCSRC UCSR0C
#define TP_UDR UDR0
#define TP_U2X U2X0
#define TP_RXEN RXEN0
#define TP_TXEN TXEN0
#define TP_UCSZ1 UCSZ01
#define TP_UCSZ0 UCSZ00
#define TP_RXC RXC0
#define TP_UDRE UDRE0
#define TP_RXCIE RXCIE0
#define TP_UDRIE UDRIE0
#define TP_UCSRB_ADDR 0xC1 /* data-space address of UCSR0B, for the assembly of the UDRE interrupt */
#if defined(USART_RX_vect)
#define TP_RX_VECT USART_RX_vect
#define TP_UDRE_VECT USART_UDRE_vect
#else
#define TP_RX_VECT USART0_RX_vect
#define TP_UDRE_VECT USART0_UDRE_vect
#endif
#elif defined(UDR1)
#define TP_UBRRH UBRR1H
#define TP_UBRRL UBRR1L
#define TP_UCSRA UCSR1A
#define TP_UCSRB UCSR1B
#define TP_UCSRC UCSR1C
#define TP_UDR UDR1
#define TP_U2X U2X1
#define TP_RXEN RXEN1
#define TP_TXEN TXEN1
#define TP_UCSZ1 UCSZ11
#define TP_UCSZ0 UCSZ10
#define TP_RXC RXC1
#define TP_UDRE UDRE1
#define TP_RXCIE RXCIE1
#define TP_UDRIE UDRIE1
#define TP_UCSRB_ADDR 0xC9
#define TP_RX_VECT USART1_RX_vect
#define TP_UDRE_VECT USART1_UDRE_vect
#else
#error "this MCU has neither USART0 nor USART1"
#endif

#ifdef TP_RX_WINDOWED
/* Received bytes wait in a ring filled by the receive interrupt, so the host may send the next frames while the
 * app computes or answers (a window of frames in flight, docs/guides/device-loop.md); the USART itself holds
 * only two. TP_RX_RING (at most 256: u8 indices) is what the model left free of the SRAM. The host never has more
 * than TP_RX_RING - 1 bytes unanswered; a byte that finds the ring full is dropped, its frame fails the CRC and
 * the host resends. */
#if TP_RX_RING > 256u
#error "tinyproto_sizes.h: TP_RX_RING is at most 256 (the ring's indices are u8)"
#endif
static uint8_t tp_ring[TP_RX_RING];
static volatile uint8_t tp_ring_head; /* written by the interrupt */
static uint8_t tp_ring_tail;          /* written by the app */

static inline uint8_t tp_ring_next(uint8_t i)
{
#if TP_RX_RING == 256u
    return (uint8_t)(i + 1u); /* wraps by itself */
#else
    return i == (uint8_t)(TP_RX_RING - 1u) ? 0u : (uint8_t)(i + 1u);
#endif
}

ISR(TP_RX_VECT)
{
    uint8_t c = TP_UDR;
    uint8_t head = tp_ring_head;
    uint8_t next = tp_ring_next(head);
    if (next != tp_ring_tail) {
        tp_ring[head] = c;
        tp_ring_head = next;
    }
}
#endif

void tp_port_init(void)
{
    /* U2X before the divisor: the rate is set by UBRR and U2X together (and a simulator reads both when UBRR
     * is written). */
    TP_UCSRA = _BV(TP_U2X);
    TP_UBRRH = (uint8_t)(TP_UBRR >> 8);
    TP_UBRRL = (uint8_t)TP_UBRR;
    TP_UCSRC = _BV(TP_UCSZ1) | _BV(TP_UCSZ0); /* 8N1 */
#ifdef TP_RX_WINDOWED
    /* How tp_port_receive and tp_port_putc wait: idle sleep, the USART and the timers keep running. Sleep stays
     * enabled: the app's only sleep instructions are those two waits, and each wait then costs two fewer
     * instructions per byte (on a simulated chip every instruction is host CPU). */
    set_sleep_mode(SLEEP_MODE_IDLE);
    sleep_enable();
    TP_UCSRB = _BV(TP_RXCIE) | _BV(TP_RXEN) | _BV(TP_TXEN);
#else
    TP_UCSRB = _BV(TP_RXEN) | _BV(TP_TXEN);
#endif
}

#ifdef TP_RX_WINDOWED
tp_rx_t tp_port_receive(tp_parser_t *p)
{
    /* One loop per frame instead of two calls per byte (tp_port_getc, tp_app_byte): every byte of a vector comes
     * through here, and on a simulated chip each instruction is host CPU. The bytes taken are given back to the
     * interrupt (tp_ring_tail) before sleeping and before returning, so before the frame is answered: the ring
     * never looks fuller to the interrupt than the frames the host has not seen answered. Waiting: sleep (idle
     * mode, chosen in tp_port_init) until the receive interrupt brings a byte; testing the ring with interrupts
     * off and sleeping right after sei (which delays them one instruction) loses no wake-up. */
    uint8_t tail = tp_ring_tail;
    for (;;) {
        if (tp_ring_head == tail) {
            tp_ring_tail = tail;
            cli();
            while (tp_ring_head == tail) {
                sei();
                sleep_cpu();
                cli();
            }
            sei();
        }
        uint8_t c = tp_ring[tail];
        tail = tp_ring_next(tail);
        tp_rx_t status = tp_parser_feed(p, c);
        if (status != TP_RX_NONE) {
            tp_ring_tail = tail;
            return status;
        }
    }
}
#else
/* No ring (the learning firmware, whose SRAM goes to the counts, or a model that leaves too little free): the
 * host sends one request at a time, and the USART's own two bytes suffice. */
int16_t tp_port_getc(void)
{
    while (!(TP_UCSRA & _BV(TP_RXC))) {
    }
    return TP_UDR;
}
#endif

#ifdef TP_RX_WINDOWED
/* The transmitter's "ready for the next byte" wakes tp_port_putc, then turns itself off again. In assembly: the
 * compiler's prologue would also save r0, r1 and Z for this one clear of a bit (andi changes SREG: saved). */
ISR(TP_UDRE_VECT, ISR_NAKED)
{
    __asm__ volatile("push r24\n\t"
                     "in r24, __SREG__\n\t"
                     "push r24\n\t"
                     "lds r24, %[ucsrb]\n\t"
                     "andi r24, %[keep]\n\t"
                     "sts %[ucsrb], r24\n\t"
                     "pop r24\n\t"
                     "out __SREG__, r24\n\t"
                     "pop r24\n\t"
                     "reti\n\t"
                     :
                     : [ucsrb] "n"(TP_UCSRB_ADDR), [keep] "n"(0xFF & ~_BV(TP_UDRIE)));
}

void tp_port_putc(uint8_t c)
{
    /* Sleep (idle mode) until the transmitter takes the next byte, like tp_port_getc waits for one: a byte of
     * an answer lasts ten bit times (160 cycles at 1 Mbaud), which a polling loop spends reading UCSRA over and
     * over, and a simulated chip simulates every one of those reads. A received byte's interrupt may wake the
     * sleep first: the loop then sleeps again. */
    if (!(TP_UCSRA & _BV(TP_UDRE))) {
        cli();
        TP_UCSRB |= _BV(TP_UDRIE); /* cleared by the interrupt once it ran; another wake-up leaves it set */
        while (!(TP_UCSRA & _BV(TP_UDRE))) {
            sei();
            sleep_cpu();
            cli();
        }
        sei();
    }
    TP_UDR = c;
}
#else
void tp_port_putc(uint8_t c)
{
    while (!(TP_UCSRA & _BV(TP_UDRE))) {
    }
    TP_UDR = c;
}
#endif

void tp_port_flush(void)
{
}

#elif defined(TP_PORT_CUSTOM)
/* tp_port_putc() and tp_port_flush() are the including harness's; it feeds tp_app_byte() itself. */
void tp_port_init(void)
{
}

int16_t tp_port_getc(void)
{
    return -1;
}

#else
#include <stdio.h>

void tp_port_init(void)
{
}

int16_t tp_port_getc(void)
{
    int c = getchar();
    return c == EOF ? -1 : (int16_t)c;
}

void tp_port_putc(uint8_t c)
{
    (void)putchar(c);
}

void tp_port_flush(void)
{
    (void)fflush(stdout); /* a response must leave now: the host waits for it */
}
#endif

void tp_transport_init(void)
{
    tp_parser_init(&tp_rx, tp_buf.b, TP_BUF_SIZE);
    tp_frames_bad = 0;
}

void tp_reply(uint8_t type, uint8_t seq, uint16_t n_payload)
{
    tp_buf.b[0] = type;
    tp_buf.b[1] = seq;
    tp_frame_send(tp_buf.b, n_payload, tp_port_putc);
    tp_port_flush();
}

void tp_reply_error(uint8_t seq, uint8_t code)
{
    if (tp_frames_bad != UINT16_MAX) {
        ++tp_frames_bad;
    }
    tp_buf.b[2] = code;
    tp_reply(TP_MSG_ERROR, seq, 1);
}
