/* Fuzz target: the multiple-choice CSV reader (eval/mc_csv.h), and for
 * accepted files the prompt builder over their questions (LLaMA-Factory's
 * layout without a chat template). Must not crash or leak; every accepted
 * question has an answer A-D and non-NULL texts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "eval/mc_csv.h"
#include "eval/mc_prompt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    at_mc_file f;
    if (at_mc_csv_parse((const char *)data, size, "fuzz.csv", &f) != AT_OK) return 0;
    for (size_t i = 0; i < f.n; i++) {
        const at_mc_item *it = &f.items[i];
        if (it->answer < 0 || it->answer > 3 || !it->question || it->line < 1) __builtin_trap();
        for (int k = 0; k < AT_MC_CHOICES; k++)
            if (!it->choices[k]) __builtin_trap();
    }
    size_t shots = f.n > 2 ? 2 : f.n - 1;
    cJSON *msgs = NULL;
    if (at_mc_messages(&f.items[f.n - 1], f.items, shots, "fuzz", size & 1 ? AT_MC_ZH : AT_MC_EN, &msgs) == AT_OK) {
        char *text = NULL;
        size_t len = 0;
        if (at_mc_prompt_text(NULL, msgs, &text, &len) == AT_OK && strlen(text) != len) __builtin_trap();
        free(text);
    }
    cJSON_Delete(msgs);
    at_mc_file_free(&f);
    return 0;
}
