/* Raw float features -> standardised int8 inputs (see tinyproto/inputstage.py, which this matches bit for bit).
 *
 * x[i] = clamp(round((raw[i] - mean[i]) * gain[i]), -127, 127) in float32; mean and gain are half floats that
 * share one power-of-two exponent per array. Only this input stage uses float; tp_predict() does not.
 */
#include <math.h>

#include "tinyproto.h"
#include "tinyproto_model.h"

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

/* One feature: x = clamp(round((raw - mean[i]) * gain[i]), -127, 127). */
static int8_t tp_input_one(float raw, uint16_t i)
{
    float mean = tp_half_to_float(tp_read_u16(&tp_input_mean[i]), TP_INPUT_MEAN_EXP);
    float gain = tp_half_to_float(tp_read_u16(&tp_input_gain[i]), TP_INPUT_GAIN_EXP);
    float t = (raw - mean) * gain;
    if (t != t) {
        t = 0.0f; /* NaN (a broken sensor reading) maps to the mean instead of undefined behaviour */
    } else if (t > 127.0f) {
        t = 127.0f;
    } else if (t < -127.0f) {
        t = -127.0f;
    }
    return (int8_t)(t >= 0.0f ? (int16_t)(t + 0.5f) : (int16_t)(t - 0.5f));
}

void tp_input_quantize(const float *raw, int8_t *x)
{
    TP_STAGE(TP_STAGE_INPUT);
    for (uint16_t i = 0; i < TP_N_FEATURES; ++i) {
        x[i] = tp_input_one(raw[i], i);
    }
    TP_STAGE(TP_STAGE_APP);
}

/* A streamed chunk: raw[0..n-1] are features first..first+n-1 (the device app converts each chunk as it arrives,
 * so no frame or buffer ever holds the whole float vector). Same arithmetic as tp_input_quantize(). */
void tp_input_quantize_range(const float *raw, uint16_t first, uint8_t n, int8_t *out)
{
    TP_STAGE(TP_STAGE_INPUT);
    for (uint8_t k = 0; k < n; ++k) {
        out[k] = tp_input_one(raw[k], (uint16_t)(first + k));
    }
    TP_STAGE(TP_STAGE_APP);
}
