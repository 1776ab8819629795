/* Fuzz target: a LoRA adapter GGUF (`--adapters FILE.gguf`, model/adapter.h)
 * for the stories260K shape, read from a file as the program reads it. Must
 * not crash or leak; an accepted adapter has the model's shapes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "device/cpu/cpu_backend.h"
#include "model/adapter.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char config[] = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 172, "
                             "\"num_hidden_layers\": 5, \"num_attention_heads\": 8, \"num_key_value_heads\": 4, "
                             "\"vocab_size\": 512, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-5}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    static at_model_config cfg;
    static int ready;
    if (!ready) {
        snprintf(path, sizeof path, "/tmp/anytune-fuzz-adapter-%ld.gguf", (long)getpid());
        if (at_model_config_parse(config, sizeof config - 1, "fuzz", &cfg) != AT_OK) abort();
        ready = 1;
    }
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    at_adapter *a = NULL;
    if (at_adapter_load(path, &cfg, at_cpu_backend(), &a) == AT_OK) {
        if (a->n_layers != cfg.num_hidden_layers || a->rank < 1) abort();
        at_adapter_free(a);
    }
    unlink(path);
    return 0;
}
