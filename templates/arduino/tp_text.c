/* tinyproto: decimal text -> float32, correctly rounded (part of the Arduino library).
 *
 * avr-libc's strtod/atof (and Arduino's Serial.parseFloat) are not correctly rounded: about one value in three
 * of a data set's shortest float32 texts comes back one unit in the last place off, so a vector sent as text would
 * not be the host's vector. tp_parse_float reads what Python's repr(np.float32(v)), printf("%.9g") and the like
 * print back to the exact float: round to nearest, ties to even, subnormals, +-inf on overflow.
 *
 * Method: a short decimal (significand below 2^24, |E| <= 10) is one float multiply or divide (exact operands,
 * one correct rounding); any other d1d2...dn x 10^E is the exact ratio A / B of two integers
 * (A = digits x 10^max(E,0), B = 10^max(-E,0)), held as little bignums on the stack; 25 quotient bits by
 * shift-and-subtract and a sticky bit give the rounding. Correctly rounded for up to 40 significant digits
 * (float32 needs 9); digits beyond the 40th only set the sticky bit, so such an input could in principle round
 * down where its full value would not.
 * SRAM: at most 140 B of stack (measured: 132-138 B), nothing static (reentrant).
 * Time on the Uno (measured): 2,100-3,100 cycles for a short number such as 0.07871 or 1214.0 (atof: 1,600);
 * about 50,000-60,000 on the exact bignum path (1e-30, 3.4e38, more than 7 significant digits or exponents
 * beyond +-10). About 1.3 kB of flash.
 */
#include <stdint.h>
#include <string.h>

#include "tp_text.h"

/* Loop counters are 16-bit on purpose: with 8-bit ones, avr-gcc 5.4 -Os (the Arduino IDE's flags) computed wrong
 * results here (seen on the simulated Uno; -O2 and the host were right). */
#define TP_BIG_LIMBS 20 /* 320 bits: 10^85 (the smallest decimal exponent that matters, with 40 digits) fits */
#define TP_MAX_DIGITS 40

typedef struct {
    uint16_t limb[TP_BIG_LIMBS]; /* little-endian */
} tp_big_t;

/* Every loop runs over the n limbs in use only (n covers both numbers), not all 20. */

static uint8_t tp_big_mul_add(tp_big_t *a, uint8_t n, uint16_t factor, uint16_t add) /* returns the new n */
{
    uint32_t carry = add;
    for (uint16_t i = 0; i < n; ++i) {
        uint32_t t = (uint32_t)a->limb[i] * factor + carry;
        a->limb[i] = (uint16_t)t;
        carry = t >> 16;
    }
    if (carry && n < TP_BIG_LIMBS) {
        a->limb[n++] = (uint16_t)carry; /* carry < 2^16: factor and add are 16-bit */
    }
    return n;
}

static uint8_t tp_big_pow10(tp_big_t *a, uint8_t n, int16_t k)
{
    for (; k >= 4; k -= 4) {
        n = tp_big_mul_add(a, n, 10000u, 0);
    }
    for (; k > 0; --k) {
        n = tp_big_mul_add(a, n, 10u, 0);
    }
    return n;
}

static int16_t tp_big_bits(const tp_big_t *a, uint8_t n)
{
    for (int16_t i = (int16_t)n - 1; i >= 0; --i) {
        if (a->limb[i]) {
            int16_t bits = (int16_t)(16 * i);
            for (uint16_t v = a->limb[i]; v; v >>= 1) {
                ++bits;
            }
            return bits;
        }
    }
    return 0;
}

static void tp_big_shl(tp_big_t *a, uint8_t n, int16_t shift)
{
    int16_t words = shift / 16;
    uint8_t bits = (uint8_t)(shift % 16);
    for (int16_t i = (int16_t)n - 1; i >= 0; --i) {
        int16_t src = i - words;
        uint16_t hi = src >= 0 ? a->limb[src] : 0;
        uint16_t lo = (src - 1 >= 0) ? a->limb[src - 1] : 0;
        a->limb[i] = bits ? (uint16_t)((hi << bits) | (lo >> (16 - bits))) : hi;
    }
}

static int8_t tp_big_cmp(const tp_big_t *a, const tp_big_t *b, uint8_t n)
{
    for (int16_t i = (int16_t)n - 1; i >= 0; --i) {
        if (a->limb[i] != b->limb[i]) {
            return a->limb[i] > b->limb[i] ? 1 : -1;
        }
    }
    return 0;
}

static void tp_big_sub(tp_big_t *a, const tp_big_t *b, uint8_t n) /* a -= b, a >= b */
{
    uint16_t borrow = 0;
    for (uint16_t i = 0; i < n; ++i) {
        uint32_t t = (uint32_t)a->limb[i] - b->limb[i] - borrow;
        a->limb[i] = (uint16_t)t;
        borrow = (t >> 16) ? 1 : 0;
    }
}

static int tp_big_is_zero(const tp_big_t *a, uint8_t n)
{
    for (uint16_t i = 0; i < n; ++i) {
        if (a->limb[i]) {
            return 0;
        }
    }
    return 1;
}

static float tp_from_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Weak: every tinyproto library of a sketch carries this same function; the linker keeps one copy. */
__attribute__((weak)) float tp_parse_float(const char *text, const char **end)
{
    const char *s = text;
    uint32_t sign = 0;
    tp_big_t a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    b.limb[0] = 1;
    uint8_t n = 1; /* limbs in use by a and b */

    while (*s == ' ' || *s == '\t') {
        ++s;
    }
    if (*s == '-' || *s == '+') {
        sign = (*s == '-') ? 0x80000000ul : 0;
        ++s;
    }
    uint8_t digits = 0, any = 0, sticky = 0;
    int16_t exp10 = 0;
    for (uint8_t point = 0;; ++s) {
        if (*s == '.' && !point) {
            point = 1;
            continue;
        }
        if (*s < '0' || *s > '9') {
            break;
        }
        any = 1;
        uint8_t d = (uint8_t)(*s - '0');
        if (digits < TP_MAX_DIGITS) {
            if (digits || d) {
                n = tp_big_mul_add(&a, n, 10u, d);
                ++digits;
            }
            if (point) {
                --exp10;
            }
        } else {
            sticky |= d;
            if (!point) {
                ++exp10;
            }
        }
    }
    if (!any) {
        if (end) {
            *end = text;
        }
        return 0.0f;
    }
    if (*s == 'e' || *s == 'E') {
        const char *e = s + 1;
        int8_t esign = 1;
        if (*e == '-' || *e == '+') {
            esign = (*e == '-') ? -1 : 1;
            ++e;
        }
        if (*e >= '0' && *e <= '9') {
            int16_t value = 0;
            for (; *e >= '0' && *e <= '9'; ++e) {
                if (value < 1000) {
                    value = (int16_t)(value * 10 + (*e - '0'));
                }
            }
            exp10 = (int16_t)(exp10 + esign * value);
            s = e;
        }
    }
    if (end) {
        *end = s;
    }
    if (digits == 0) {
        return tp_from_bits(sign); /* +-0 */
    }
    /* Fast path (Clinger): a significand below 2^24 and a power of ten up to 10^10 are both exact in float32,
     * so one IEEE multiply or divide (correctly rounded in avr-libc, as on the host) gives the nearest float.
     * This covers most sensor readings (0.07871, 1214.5, -3.25). */
    if (!sticky && n <= 2 && a.limb[1] < 0x100u && exp10 >= -10 && exp10 <= 10) {
        float scale = 1.0f; /* 10^|E|, built exactly (every power up to 10^10 is a float32) */
        for (int16_t k = exp10 >= 0 ? exp10 : (int16_t)-exp10; k > 0; --k) {
            scale *= 10.0f;
        }
        float value = (float)(((uint32_t)a.limb[1] << 16) | a.limb[0]);
        value = exp10 >= 0 ? value * scale : value / scale;
        return sign ? -value : value;
    }
    int16_t magnitude = (int16_t)(digits + exp10); /* the value lies in [10^(magnitude-1), 10^magnitude) */
    if (magnitude > 40) {
        return tp_from_bits(sign | 0x7F800000ul); /* beyond FLT_MAX (3.4e38): infinity */
    }
    if (magnitude < -46) {
        return tp_from_bits(sign); /* below half the smallest subnormal (1.4e-45): zero */
    }
    uint8_t nb = 1;
    if (exp10 >= 0) {
        n = tp_big_pow10(&a, n, exp10);
    } else {
        nb = tp_big_pow10(&b, nb, (int16_t)-exp10);
    }
    int16_t bits_a = tp_big_bits(&a, n), bits_b = tp_big_bits(&b, nb);
    /* Scale so that 1 <= a/b < 2; e is the binary exponent of the value. */
    int16_t e = (int16_t)(bits_a - bits_b);
    int16_t widest = (int16_t)((e > 0 ? bits_a : bits_b) + 2); /* the bits a and b need from now on */
    n = (uint8_t)((widest + 15) / 16);
    if (e > 0) {
        tp_big_shl(&b, n, e);
    } else if (e < 0) {
        tp_big_shl(&a, n, (int16_t)-e);
    }
    if (tp_big_cmp(&a, &b, n) < 0) {
        tp_big_shl(&a, n, 1);
        --e;
    }
    if (e > 127) {
        return tp_from_bits(sign | 0x7F800000ul);
    }
    /* precision: 24 bits for a normal float, fewer for a subnormal (the exponent stops at -126) */
    int16_t precision = e >= -126 ? 24 : (int16_t)(24 - (-126 - e));
    if (precision < 0) {
        return tp_from_bits(sign);
    }
    uint32_t m = 0;
    for (int16_t i = 0; i <= precision; ++i) { /* precision mantissa bits, then the round bit */
        m <<= 1;
        if (tp_big_cmp(&a, &b, n) >= 0) {
            tp_big_sub(&a, &b, n);
            m |= 1;
        }
        tp_big_shl(&a, n, 1);
    }
    uint8_t round = (uint8_t)(m & 1);
    m >>= 1;
    if (!tp_big_is_zero(&a, n)) {
        sticky = 1;
    }
    if (round && (sticky || (m & 1))) {
        ++m;
    }
    if (precision == 24) {
        if (m == (1ul << 24)) { /* rounding carried into a new bit */
            m >>= 1;
            ++e;
            if (e > 127) {
                return tp_from_bits(sign | 0x7F800000ul);
            }
        }
        return tp_from_bits(sign | ((uint32_t)(e + 127) << 23) | (m & 0x7FFFFFul));
    }
    return tp_from_bits(sign | m); /* subnormal: m x 2^-149 (m = 2^23 after rounding is the smallest normal) */
}
