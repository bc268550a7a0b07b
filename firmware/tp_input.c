/* Raw float features -> int8 inputs (see tinyproto/core/inputstage.py, which this matches bit for bit).
 *
 * x[i] = clamp(round((raw[i] - mean[i]) * gain[i]), -127, 127) in float32; mean and gain are half floats that
 * share one power-of-two exponent per array. With TP_INPUT_SHARED 1 the stage stores one offset and one gain
 * for every feature (4 bytes in all: pixels, same-unit sensors), decoded once per call; a centred stage
 * (TP_INPUT_CENTRE_BITS 2 or 4) then subtracts a per-feature centre, code * TP_INPUT_CENTRE_STEP +
 * TP_INPUT_CENTRE_BASE int8 steps (codes packed LSB first), from the scaled value. Only the kept features
 * (TP_N_FEATURES of the data's TP_N_INPUTS columns, in order) reach the device. Only this input stage uses
 * float; tp_predict() does not.
 */
#include <math.h>

#include "tinyproto.h"
#include "tinyproto_model.h"

#ifndef TP_INPUT_SHARED
#define TP_INPUT_SHARED 0
#endif
#ifndef TP_INPUT_CENTRE_BITS
#define TP_INPUT_CENTRE_BITS 0
#endif
#if TP_INPUT_CENTRE_BITS != 0 && TP_INPUT_CENTRE_BITS != 2 && TP_INPUT_CENTRE_BITS != 4
#error "TP_INPUT_CENTRE_BITS must be 0, 2 or 4"
#endif


/* Decode an IEEE half float scaled by 2^shared_exp; exact in float32 (11-bit mantissa, power-of-two scale). */
static float tp_half_to_float(uint16_t bits, int16_t shared_exp)
{
    int16_t biased = (int16_t)((bits >> 10) & 0x1F);
    int32_t mantissa = (int32_t)(bits & 0x3FF);
    int16_t power = shared_exp;
    if (biased == 0) {
        power = (int16_t)(power - 24); /* subnormal: m * 2^-24 */
    } else {
        mantissa |= 0x400;
        power = (int16_t)(power + biased - 25); /* normal: (1024 + m) * 2^(e - 25) */
    }
    float value = (float)ldexp((float)mantissa, power);
    return (bits & 0x8000u) ? -value : value;
}

#if TP_INPUT_CENTRE_BITS
/* Feature i's centre in int8 steps (a whole number: the float32 subtraction is the host's exactly). */
static float tp_input_centre_of(uint16_t i)
{
    uint8_t byte = tp_read_u8(&tp_input_centre[i / (8u / TP_INPUT_CENTRE_BITS)]);
    uint8_t shift = (uint8_t)((i % (8u / TP_INPUT_CENTRE_BITS)) * TP_INPUT_CENTRE_BITS);
    int16_t code = (int16_t)((byte >> shift) & ((1u << TP_INPUT_CENTRE_BITS) - 1u));
    return (float)(int16_t)(code * TP_INPUT_CENTRE_STEP + (TP_INPUT_CENTRE_BASE));
}
#endif

#define TP_FLOAT_INF_BITS 0x7F800000UL /* +infinity; larger magnitudes are NaNs */
#define TP_FLOAT_127_BITS 0x42FE0000UL /* 127.0f */

static int8_t tp_input_one(float raw, float mean, float gain, float centre)
{
    float t = (raw - mean) * gain;
#if TP_INPUT_CENTRE_BITS
    t = t - centre;
#else
    (void)centre;
#endif
    /* The tests on t read its IEEE bits as an integer (a float compare is a soft-float call of ~100 cycles on
     * AVR, four per feature): below the sign bit, the bits of a float grow with its magnitude, NaNs above
     * infinity. Same results as the float form: NaN (a broken sensor reading) maps to the mean, |t| >= 127
     * clamps, and round half away from zero of -t is minus that of t (so -0.0 gives 0 either way). */
    union {
        float f;
        uint32_t u;
    } v;
    v.f = t;
    uint8_t negative = (uint8_t)(v.u >> 31);
    v.u &= 0x7FFFFFFFUL;
    if (v.u > TP_FLOAT_INF_BITS) {
        return 0;
    }
    int8_t magnitude = v.u >= TP_FLOAT_127_BITS ? 127 : (int8_t)(int16_t)(v.f + 0.5f);
    return negative ? (int8_t)-magnitude : magnitude;
}

/* Features first .. first+n-1 (kept-feature indices) from raw[0 .. n-1] into out[0 .. n-1]: the chunked raw-float
 * path converts each chunk as it arrives, so no frame ever holds the whole float vector. */
void tp_input_quantize_range(const float *raw, uint16_t first, uint8_t n, int8_t *out)
{
    TP_STAGE(TP_STAGE_INPUT);
#if TP_INPUT_SHARED
    float mean = tp_half_to_float(tp_read_u16(&tp_input_mean[0]), TP_INPUT_MEAN_EXP);
    float gain = tp_half_to_float(tp_read_u16(&tp_input_gain[0]), TP_INPUT_GAIN_EXP);
    (void)first;
    for (uint8_t k = 0; k < n; ++k) {
#if TP_INPUT_CENTRE_BITS
        out[k] = tp_input_one(raw[k], mean, gain, tp_input_centre_of((uint16_t)(first + k)));
#else
        out[k] = tp_input_one(raw[k], mean, gain, 0.0f);
#endif
    }
#else
    for (uint8_t k = 0; k < n; ++k) {
        uint16_t i = (uint16_t)(first + k);
        float mean = tp_half_to_float(tp_read_u16(&tp_input_mean[i]), TP_INPUT_MEAN_EXP);
        float gain = tp_half_to_float(tp_read_u16(&tp_input_gain[i]), TP_INPUT_GAIN_EXP);
        out[k] = tp_input_one(raw[k], mean, gain, 0.0f);
    }
#endif
    TP_STAGE(TP_STAGE_APP);
}

void tp_input_quantize(const float *raw, int8_t *x)
{
    for (uint16_t first = 0; first < TP_N_FEATURES; first = (uint16_t)(first + 255u)) {
        uint16_t left = (uint16_t)(TP_N_FEATURES - first);
        tp_input_quantize_range(raw + first, first, (uint8_t)(left < 255u ? left : 255u), x + first);
    }
}
