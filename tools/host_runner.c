/* Host harness: runs the generated model's C code on this machine, for equivalence tests.
 *
 *   host_runner        reads int8 vectors (TP_N_FEATURES bytes each) from stdin, prints "label s0 s1 ..." lines
 *   host_runner raw    reads float32 vectors, prints "x0 ... x{d-1} | label s0 s1 ..." (the input stage too)
 */
#include <stdio.h>
#include <string.h>

#include "tinyproto.h"
#include "tinyproto_model.h"

static void print_prediction(const int8_t *x)
{
    int32_t scores[TP_N_CLASSES];
    uint8_t label = tp_predict(x, scores);
    printf("%u", (unsigned)label);
    for (uint16_t l = 0; l < TP_N_CLASSES; ++l) {
        printf(" %ld", (long)scores[l]);
    }
    printf("\n");
}

int main(int argc, char **argv)
{
    int8_t x[TP_N_FEATURES];
    if (argc > 1 && strcmp(argv[1], "raw") == 0) {
        float raw[TP_N_FEATURES];
        while (fread(raw, sizeof raw[0], TP_N_FEATURES, stdin) == TP_N_FEATURES) {
            tp_input_quantize(raw, x);
            for (uint16_t i = 0; i < TP_N_FEATURES; ++i) {
                printf("%d ", x[i]);
            }
            printf("| ");
            print_prediction(x);
        }
        return 0;
    }
    while (fread(x, 1, TP_N_FEATURES, stdin) == TP_N_FEATURES) {
        print_prediction(x);
    }
    return 0;
}
