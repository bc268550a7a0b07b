/* tinyproto: decimal text -> float32, correctly rounded (see tp_text.c). */
#ifndef TP_TEXT_H
#define TP_TEXT_H

#ifdef __cplusplus
extern "C" {
#endif

/* Reads a decimal number ("-12.5", "0.07871", "1e-3", "3.4028235e38") at text (leading spaces/tabs skipped)
 * and returns the nearest float32, exactly as the host would read it (unlike avr-libc's strtod/atof).
 * *end (if end is not NULL) is set after the number, or to text when there is none (then 0 is returned).
 * No inf/nan words; overflow gives +-inf, underflow +-0.
 * SRAM: at most 140 B of stack (measured: 132-138 B), nothing static (reentrant). */
float tp_parse_float(const char *text, const char **end);

#ifdef __cplusplus
}
#endif

#endif /* TP_TEXT_H */
