/* Fuzz target: config.json parsing (and, for accepted configs, the RoPE
 * frequencies and the config.json writer), and a vision-language config's
 * vision side (vision_config.h) with its tensor list. Must not crash or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <cjson/cJSON.h>
#include "model/config.h"
#include "model/vision_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    at_model_config cfg;
    /* and read as another family (--model_type), which rewrites the parsed object's model_type */
    static const char *const as[] = {"qwen2_5", "qwen3", "mistral", "llama3_1"};
    if (size > 0) (void)at_model_config_parse_as((const char *)data, size, "fuzz", as[data[size - 1] % 4], &cfg);
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    at_vision_config vc;
    if (root && at_vision_config_from_json(root, "fuzz", &vc) == AT_OK && vc.depth <= 64) {
        at_vision_tensor *t = NULL;
        size_t n = 0;
        if (at_vision_tensors(&vc, &t, &n) == AT_OK) free(t);
    }
    cJSON_Delete(root);
    if (at_model_config_parse((const char *)data, size, "fuzz", &cfg) != AT_OK) return 0;
    if (cfg.head_dim <= 8192) {
        float *f = malloc((size_t)cfg.head_dim / 2 * sizeof *f + 1);
        if (f) (void)at_model_config_rope_inv_freq(&cfg, f);
        free(f);
    }
    char *json = NULL;
    if (at_model_config_to_json(&cfg, &json) == AT_OK) {
        at_model_config back;
        (void)at_model_config_parse(json, 0 + __builtin_strlen(json), "fuzz round trip", &back);
    }
    free(json);
    return 0;
}
