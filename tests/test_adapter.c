/* PEFT adapters: fresh initialization as PEFT does it, save/load round trip
 * with PEFT's tensor names and config fields, and refusal of what we cannot
 * honor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/json.h"
#include "device/cpu/cpu_backend.h"
#include "model/adapter.h"
#include "model/safetensors.h"
#include "train/run_files.h"
#include "testing.h"

static at_model_config small_config(void)
{
    at_model_config c;
    at_model_config_init(&c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.hidden_size = 24;
    c.intermediate_size = 40;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 6;
    c.vocab_size = 50;
    return c;
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char *p = at_path_join(dir, name);
    CHECK_OK(at_write_file_atomic(p, text, strlen(text)));
    free(p);
}

int main(void)
{
    at_model_config cfg = small_config();
    at_backend *be = at_cpu_backend();
    unsigned mask = 0;
    const char *all[] = {"all-linear"};
    CHECK_OK(at_parse_target_modules(all, 1, &mask));
    CHECK(mask == 0x7f);
    const char *some[] = {"q_proj", "v_proj"};
    CHECK_OK(at_parse_target_modules(some, 2, &mask));
    CHECK(mask == ((1u << AT_MOD_Q) | (1u << AT_MOD_V)));
    const char *bad[] = {"qkv_proj"};
    CHECK_FAILS(at_parse_target_modules(bad, 1, &mask), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "qkv_proj") != NULL);

    at_adapter *a = NULL;
    CHECK_OK(at_adapter_new(&cfg, be, 4, 8.0, 0.05, 0, 0x7f, 1234, &a));
    if (!a) return at_test_result("test_adapter");
    CHECK_NEAR(a->scale, 2.0, 1e-12);
    /* A uniform in ±1/sqrt(in), B zero */
    for (int l = 0; l < 2; l++)
        for (int m = 0; m < AT_MOD_COUNT; m++) {
            at_lora_pair *p = at_adapter_pair(a, l, (at_module)m);
            int64_t in, out;
            at_module_dims(&cfg, (at_module)m, &in, &out);
            CHECK(p->A && p->A->shape[0] == 4 && p->A->shape[1] == in);
            CHECK(p->B && p->B->shape[0] == out && p->B->shape[1] == 4);
            const float *A = at_tensor_data(p->A), *B = at_tensor_data(p->B);
            double bound = 1.0 / sqrt((double)in), maxa = 0;
            for (int64_t i = 0; i < at_tensor_numel(p->A); i++) maxa = fmax(maxa, fabs(A[i]));
            CHECK(maxa <= bound && maxa > 0.5 * bound);
            for (int64_t i = 0; i < at_tensor_numel(p->B); i++) CHECK(B[i] == 0.0f);
        }
    char name[160];
    at_adapter_tensor_name(1, AT_MOD_DOWN, "lora_B", name, sizeof name);
    CHECK(!strcmp(name, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
    at_adapter_tensor_name(0, AT_MOD_Q, "lora_A", name, sizeof name);
    CHECK(!strcmp(name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));

    /* give B values so the round trip means something */
    float *B0 = at_tensor_data(at_adapter_pair(a, 0, AT_MOD_O)->B);
    for (int64_t i = 0; i < at_tensor_numel(at_adapter_pair(a, 0, AT_MOD_O)->B); i++) B0[i] = 0.01f * (float)i;

    char dir[] = "/tmp/anytune-adapter-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK_OK(at_adapter_save(a, dir));
    /* the files say what peft expects */
    char *cfg_path = at_path_join(dir, "adapter_config.json");
    cJSON *j = NULL;
    CHECK_OK(at_json_parse_file(cfg_path, &j));
    if (j) {
        CHECK(!strcmp(cJSON_GetObjectItem(j, "peft_type")->valuestring, "LORA"));
        CHECK(!strcmp(cJSON_GetObjectItem(j, "task_type")->valuestring, "CAUSAL_LM"));
        CHECK(cJSON_GetObjectItem(j, "r")->valueint == 4);
        CHECK(cJSON_GetObjectItem(j, "lora_alpha")->valuedouble == 8.0);
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(j, "target_modules")) == 7);
        cJSON_Delete(j);
    }
    char *st_path = at_path_join(dir, "adapter_model.safetensors");
    at_st_file *f = NULL;
    CHECK_OK(at_st_open(st_path, &f));
    if (f) {
        CHECK(at_st_count(f) == 2 * 2 * 7);
        const at_st_info *info = at_st_find(f, "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight");
        CHECK(info && info->ndim == 2 && info->shape[0] == 12 && info->shape[1] == 4 && !strcmp(info->dtype_name, "F32"));
        at_st_close(f);
    }
    at_adapter *b = NULL;
    CHECK_OK(at_adapter_load(dir, &cfg, be, &b));
    if (b) {
        CHECK(b->rank == 4 && b->alpha == 8.0 && fabs(b->dropout - 0.05) < 1e-12 && b->target_mask == 0x7f);
        int same = 1;
        for (int l = 0; l < 2; l++)
            for (int m = 0; m < AT_MOD_COUNT; m++) {
                at_lora_pair *p = at_adapter_pair(a, l, (at_module)m), *q = at_adapter_pair(b, l, (at_module)m);
                same &= !memcmp(at_tensor_data(p->A), at_tensor_data(q->A), at_tensor_nbytes(p->A));
                same &= !memcmp(at_tensor_data(p->B), at_tensor_data(q->B), at_tensor_nbytes(p->B));
            }
        CHECK(same);
        at_adapter_free(b);
        b = NULL;
    }
    /* an adapter for another model: the mis-shaped tensor is named */
    at_model_config other = cfg;
    other.hidden_size = 32;
    other.head_dim = 8;
    CHECK_FAILS(at_adapter_load(dir, &other, be, &b), AT_ERR_FORMAT);
    CHECK_MSG(strstr(at_last_error(), "lora_A") != NULL, "%s", at_last_error());
    /* what we cannot honor is refused with the reason */
    write_text(dir, "adapter_config.json", "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"use_dora\": true, \"target_modules\": [\"q_proj\"]}");
    CHECK_FAILS(at_adapter_load(dir, &cfg, be, &b), AT_ERR_UNSUPPORTED);
    CHECK(strstr(at_last_error(), "DoRA") != NULL);
    write_text(dir, "adapter_config.json", "{\"peft_type\": \"IA3\", \"r\": 4}");
    CHECK_FAILS(at_adapter_load(dir, &cfg, be, &b), AT_ERR_UNSUPPORTED);
    write_text(dir, "adapter_config.json", "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"], \"lora_alpha\": ");
    CHECK_FAILS(at_adapter_load(dir, &cfg, be, &b), AT_ERR_FORMAT);
    /* a subset of modules loads just those (rsLoRA scale too) */
    write_text(dir, "adapter_config.json", "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"use_rslora\": true, \"target_modules\": \"v_proj\"}");
    CHECK_OK(at_adapter_load(dir, &cfg, be, &b));
    if (b) {
        CHECK(b->target_mask == (1u << AT_MOD_V) && fabs(b->scale - 4.0) < 1e-12);
        CHECK(at_adapter_pair(b, 0, AT_MOD_Q)->A == NULL);
        at_adapter_free(b);
    }
    at_adapter_free(a);
    free(cfg_path);
    free(st_path);
    CHECK_OK(at_remove_tree(dir));
    return at_test_result("test_adapter");
}
