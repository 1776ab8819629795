/* Model configs: real config.json files, family members under other names,
 * refusals of what the decoder cannot honour, and RoPE inverse frequencies
 * against torch goldens (tools/make_rope_goldens.py). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/json.h"
#include "model/config.h"
#include "testing.h"

static void test_real_configs(void)
{
    at_model_config c;
    CHECK_OK(at_model_config_load("tests/data/models/configs/mistral-7b-instruct-v0.3.config.json", &c));
    CHECK(strcmp(c.model_type, "mistral") == 0);
    CHECK(c.hidden_size == 4096 && c.intermediate_size == 14336 && c.num_hidden_layers == 32);
    CHECK(c.num_attention_heads == 32 && c.num_key_value_heads == 8 && c.head_dim == 128 && c.vocab_size == 32768);
    CHECK(c.rms_norm_eps == 1e-5 && c.rope_theta == 1e6 && c.rope_type == AT_ROPE_DEFAULT);
    CHECK(c.max_position_embeddings == 32768 && c.sliding_window == 0 && !c.tie_word_embeddings);
    CHECK(!c.attn_qkv_bias && !c.attn_o_bias && !c.qk_norm);
    CHECK(c.has_dtype && c.dtype == AT_BF16 && strcmp(c.torch_dtype, "bfloat16") == 0);
    CHECK(c.bos_token_id == 1 && c.n_eos == 1 && c.eos_token_ids[0] == 2);

    CHECK_OK(at_model_config_load("tests/data/models/configs/qwen2-1.5b-instruct.config.json", &c));
    CHECK(strcmp(c.model_type, "qwen2") == 0);
    CHECK(c.hidden_size == 1536 && c.intermediate_size == 8960 && c.num_hidden_layers == 28);
    CHECK(c.num_attention_heads == 12 && c.num_key_value_heads == 2 && c.head_dim == 128 && c.vocab_size == 151936);
    CHECK(c.rms_norm_eps == 1e-6 && c.tie_word_embeddings);
    CHECK(c.attn_qkv_bias && !c.attn_o_bias); /* qwen2: q/k/v bias always, o never */
    CHECK(c.sliding_window == 0);             /* use_sliding_window false */
    CHECK(c.bos_token_id == 151643 && c.n_eos == 1 && c.eos_token_ids[0] == 151645);
}

/* Family members with their published config.json fields (abridged). */
static const char *tinyllama =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 2048,"
    "\"intermediate_size\": 5632, \"num_hidden_layers\": 22, \"num_attention_heads\": 32, \"num_key_value_heads\": 4,"
    "\"vocab_size\": 32000, \"rms_norm_eps\": 1e-05, \"max_position_embeddings\": 2048, \"hidden_act\": \"silu\","
    "\"rope_scaling\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 1,"
    "\"eos_token_id\": 2, \"pretraining_tp\": 1}";
static const char *llama32 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 2048, \"head_dim\": 64,"
    "\"intermediate_size\": 8192, \"num_hidden_layers\": 16, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
    "\"vocab_size\": 128256, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"attention_bias\": false,"
    "\"mlp_bias\": false, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,"
    "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": true,"
    "\"max_position_embeddings\": 131072, \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009],"
    "\"torch_dtype\": \"bfloat16\", \"hidden_act\": \"silu\"}";
static const char *qwen3 =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 1024, \"head_dim\": 128,"
    "\"intermediate_size\": 3072, \"num_hidden_layers\": 28, \"num_attention_heads\": 16, \"num_key_value_heads\": 8,"
    "\"vocab_size\": 151936, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000, \"rope_scaling\": null,"
    "\"attention_bias\": false, \"sliding_window\": null, \"use_sliding_window\": false, \"max_window_layers\": 28,"
    "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 151643, \"eos_token_id\": 151645,"
    "\"hidden_act\": \"silu\", \"max_position_embeddings\": 40960}";
static const char *smollm =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 576,"
    "\"intermediate_size\": 1536, \"num_hidden_layers\": 30, \"num_attention_heads\": 9, \"num_key_value_heads\": 3,"
    "\"vocab_size\": 49152, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true,"
    "\"bos_token_id\": 0, \"eos_token_id\": 0, \"hidden_act\": \"silu\", \"max_position_embeddings\": 2048,"
    "\"torch_dtype\": \"float32\"}";

static at_status parse(const char *text, at_model_config *c)
{
    return at_model_config_parse(text, strlen(text), "test config", c);
}

static void test_family(void)
{
    at_model_config c;
    CHECK_OK(parse(tinyllama, &c));
    CHECK(strcmp(c.model_type, "llama") == 0 && c.head_dim == 64 && c.num_key_value_heads == 4 && c.rope_theta == 10000);
    CHECK(!c.tie_word_embeddings && c.rope_type == AT_ROPE_DEFAULT);
    CHECK_OK(parse(llama32, &c));
    CHECK(c.rope_type == AT_ROPE_LLAMA3 && c.rope_factor == 32 && c.rope_low_freq_factor == 1 &&
          c.rope_high_freq_factor == 4 && c.rope_original_max_position_embeddings == 8192);
    CHECK(c.n_eos == 3 && c.eos_token_ids[2] == 128009 && c.tie_word_embeddings && c.head_dim == 64);
    CHECK_OK(parse(qwen3, &c));
    CHECK(c.qk_norm && !c.attn_qkv_bias && !c.attn_o_bias && c.head_dim == 128 && c.hidden_size == 1024);
    CHECK(c.sliding_window == 0);
    CHECK_OK(parse(smollm, &c));
    CHECK(c.head_dim == 64 && c.num_attention_heads == 9 && c.num_key_value_heads == 3 && c.bos_token_id == 0);
    CHECK(c.dtype == AT_F32);
}

/* Edits one field of a base config and parses it. */
static at_status parse_edit(const char *key, const char *json_value, at_model_config *c)
{
    cJSON *o = NULL;
    at_status st = at_json_parse(tinyllama, strlen(tinyllama), "base", &o);
    if (st != AT_OK) return st;
    cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    if (json_value) {
        cJSON *v = cJSON_Parse(json_value);
        cJSON_AddItemToObject(o, key, v);
    }
    st = at_model_config_from_json(o, "edited config", c);
    cJSON_Delete(o);
    return st;
}

#define CHECK_REFUSED(key, val, code, text) do { at_model_config c_; at_status s_ = parse_edit(key, val, &c_); \
    CHECK_MSG(s_ == (code), "%s=%s: %s", key, val ? val : "(absent)", at_status_name(s_)); \
    CHECK_MSG(strstr(at_last_error(), text) != NULL, "message \"%s\" lacks \"%s\"", at_last_error(), text); } while (0)

static void test_refusals(void)
{
    CHECK_REFUSED("model_type", "\"gemma\"", AT_ERR_UNSUPPORTED, "\"gemma\"");
    CHECK_REFUSED("hidden_act", "\"gelu\"", AT_ERR_UNSUPPORTED, "hidden_act \"gelu\"");
    CHECK_REFUSED("rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4}", AT_ERR_UNSUPPORTED, "\"yarn\"");
    CHECK_REFUSED("rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2}", AT_ERR_UNSUPPORTED, "\"dynamic\"");
    CHECK_REFUSED("rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8}", AT_ERR_FORMAT, "low_freq_factor");
    CHECK_REFUSED("rope_scaling", "{\"factor\": 8}", AT_ERR_FORMAT, "rope_type");
    CHECK_REFUSED("mlp_bias", "true", AT_ERR_UNSUPPORTED, "mlp_bias");
    CHECK_REFUSED("num_key_value_heads", "5", AT_ERR_FORMAT, "num_key_value_heads 5");
    CHECK_REFUSED("hidden_size", NULL, AT_ERR_FORMAT, "\"hidden_size\" is missing");
    CHECK_REFUSED("hidden_size", "\"2048\"", AT_ERR_FORMAT, "hidden_size");
    CHECK_REFUSED("num_hidden_layers", "-1", AT_ERR_FORMAT, "num_hidden_layers");
    CHECK_REFUSED("hidden_size", "2048.5", AT_ERR_FORMAT, "hidden_size");
    CHECK_REFUSED("eos_token_id", "[1, \"x\"]", AT_ERR_FORMAT, "eos_token_id");
    CHECK_REFUSED("partial_rotary_factor", "0.5", AT_ERR_UNSUPPORTED, "partial_rotary_factor");
    CHECK_REFUSED("rms_norm_eps", "0", AT_ERR_FORMAT, "rms_norm_eps");
    at_model_config c;
    CHECK(at_model_config_parse("[1]", 3, "arr", &c) == AT_ERR_FORMAT);
    CHECK(at_model_config_parse("{\"model_type\": ", 15, "cut.json", &c) == AT_ERR_FORMAT &&
          strstr(at_last_error(), "cut.json"));
    /* Accepted variants. */
    CHECK_OK(parse_edit("rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}", &c));
    CHECK(c.rope_type == AT_ROPE_LINEAR && c.rope_factor == 2.0);
    CHECK_OK(parse_edit("rope_scaling", "{\"rope_type\": \"default\"}", &c));
    CHECK(c.rope_type == AT_ROPE_DEFAULT);
    CHECK_OK(parse_edit("attention_bias", "true", &c));
    CHECK(c.attn_qkv_bias && c.attn_o_bias);
    CHECK_OK(parse_edit("num_key_value_heads", "null", &c));
    CHECK(c.num_key_value_heads == 32);
    CHECK_OK(parse_edit("model_type", NULL, &c)); /* falls back on architectures */
    CHECK(strcmp(c.model_type, "llama") == 0);
    CHECK_OK(parse_edit("eos_token_id", "null", &c));
    CHECK(c.n_eos == 0);
}

static void test_sliding_window(void)
{
    at_model_config c;
    const char *mistral = "{\"model_type\": \"mistral\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                          "\"sliding_window\": 4096}";
    CHECK_OK(parse(mistral, &c));
    CHECK(c.sliding_window == 4096);
    const char *q2 = "{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                     "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                     "\"sliding_window\": 1024, \"use_sliding_window\": true, \"max_window_layers\": 2}";
    CHECK_OK(parse(q2, &c));
    CHECK(c.sliding_window == 1024);
    const char *q2all = "{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                        "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                        "\"sliding_window\": 1024, \"use_sliding_window\": true, \"max_window_layers\": 4}";
    CHECK_OK(parse(q2all, &c));
    CHECK(c.sliding_window == 0); /* no layer at or past max_window_layers */
}

static void test_json_round_trip(void)
{
    const char *srcs[4] = {tinyllama, llama32, qwen3, smollm};
    for (int i = 0; i < 4; i++) {
        at_model_config a, b;
        CHECK_OK(parse(srcs[i], &a));
        char *json = NULL;
        CHECK_OK(at_model_config_to_json(&a, &json));
        if (!json) continue;
        CHECK_OK(parse(json, &b));
        CHECK_MSG(memcmp(&a, &b, sizeof a) == 0, "config %d differs after to_json/parse:\n%s", i, json);
        free(json);
    }
}

/* tests/data/models/rope_inv_freq.json: torch float32 values of transformers' formulas. */
static void test_rope_goldens(void)
{
    cJSON *root = NULL;
    CHECK_OK(at_json_parse_file("tests/data/models/rope_inv_freq.json", &root));
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    int n = 0;
    for (const cJSON *cs = cases ? cases->child : NULL; cs; cs = cs->next, n++) {
        at_model_config c;
        at_model_config_init(&c);
        c.head_dim = cJSON_GetObjectItemCaseSensitive(cs, "head_dim")->valueint;
        c.rope_theta = cJSON_GetObjectItemCaseSensitive(cs, "rope_theta")->valuedouble;
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cs, "rope_scaling");
        if (cJSON_IsObject(rs)) {
            const char *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type")->valuestring;
            c.rope_type = strcmp(t, "linear") == 0 ? AT_ROPE_LINEAR : AT_ROPE_LLAMA3;
            c.rope_factor = cJSON_GetObjectItemCaseSensitive(rs, "factor")->valuedouble;
            if (c.rope_type == AT_ROPE_LLAMA3) {
                c.rope_low_freq_factor = cJSON_GetObjectItemCaseSensitive(rs, "low_freq_factor")->valuedouble;
                c.rope_high_freq_factor = cJSON_GetObjectItemCaseSensitive(rs, "high_freq_factor")->valuedouble;
                c.rope_original_max_position_embeddings =
                    (int64_t)cJSON_GetObjectItemCaseSensitive(rs, "original_max_position_embeddings")->valuedouble;
            }
        }
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(cs, "inv_freq");
        int half = c.head_dim / 2;
        CHECK(cJSON_GetArraySize(want) == half);
        float got[256], exp[256];
        CHECK_OK(at_model_config_rope_inv_freq(&c, got));
        int k = 0;
        for (const cJSON *v = want->child; v && k < 256; v = v->next) exp[k++] = (float)v->valuedouble;
        /* Per element relative error: torch's vectorised powf may differ by an ulp or two. */
        double worst = 0;
        for (int j = 0; j < half; j++) {
            double e = fabs((double)got[j] - exp[j]) / fabs((double)exp[j]);
            if (e > worst) worst = e;
        }
        CHECK_MSG(worst < 1e-6, "%s: worst relative error %.3g",
                  cJSON_GetObjectItemCaseSensitive(cs, "name")->valuestring, worst);
    }
    CHECK(n == 5);
    cJSON_Delete(root);
}

/* ms-swift's --model_type: the family the folder is read as (issue 21). */
static void test_model_type_override(void)
{
    /* every name the option accepts has a family, and nothing else does */
    char names[] = AT_MODEL_TYPE_CHOICES;
    int n = 0;
    for (char *save = NULL, *t = strtok_r(names, "|", &save); t; t = strtok_r(NULL, "|", &save), n++)
        CHECK_MSG(at_model_type_family(t) != NULL, "--model_type %s has no family", t);
    CHECK(n == 13);
    CHECK(!strcmp(at_model_type_family("qwen2_5"), "qwen2") && !strcmp(at_model_type_family("llama3_1"), "llama"));
    CHECK(at_model_type_family("gpt2") == NULL && at_model_type_family(NULL) == NULL);
    /* the demo model (llama) read as Qwen2.5: q/k/v get their bias, as Qwen2's class builds them */
    at_model_config c;
    CHECK_OK(at_model_config_load_as("demo/stories260K", NULL, &c));
    CHECK(!strcmp(c.model_type, "llama") && !c.attn_qkv_bias);
    CHECK_OK(at_model_config_load_as("demo/stories260K", "qwen2_5", &c));
    CHECK(!strcmp(c.model_type, "qwen2") && c.attn_qkv_bias && !c.attn_o_bias);
    CHECK_OK(at_model_config_load_as("demo/stories260K", "qwen3", &c));
    CHECK(!strcmp(c.model_type, "qwen3") && c.qk_norm);
    /* a config.json with a model_type we do not know loads under the override */
    const char *odd = "{\"model_type\": \"my_llama\", \"hidden_size\": 64, \"intermediate_size\": 172, "
                      "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"vocab_size\": 512}";
    char dir[] = "/tmp/at_model_type_XXXXXX";
    if (mkdtemp(dir)) {
        char path[64];
        snprintf(path, sizeof path, "%s/config.json", dir);
        FILE *f = fopen(path, "w");
        if (f) {
            fputs(odd, f);
            fclose(f);
        }
        CHECK_FAILS(at_model_config_load(dir, &c), AT_ERR_UNSUPPORTED);
        CHECK_OK(at_model_config_load_as(dir, "llama3", &c));
        CHECK(!strcmp(c.model_type, "llama") && c.num_hidden_layers == 2);
        /* an unknown --model_type names the known ones */
        CHECK_FAILS(at_model_config_load_as(dir, "gpt2", &c), AT_ERR_INVALID);
        CHECK_MSG(strstr(at_last_error(), "gpt2") && strstr(at_last_error(), "qwen2_5"), "%s", at_last_error());
        remove(path);
        rmdir(dir);
    }
    /* a source whose family is its tensors' (GGUF, llama2.c): another family is refused */
    CHECK_OK(at_model_type_check(&c, "x.gguf", NULL));
    CHECK_OK(at_model_type_check(&c, "x.gguf", "llama3_2"));
    CHECK_FAILS(at_model_type_check(&c, "x.gguf", "qwen2"), AT_ERR_INVALID);
}

int main(void)
{
    test_real_configs();
    test_family();
    test_model_type_override();
    test_refusals();
    test_sliding_window();
    test_json_round_trip();
    test_rope_goldens();
    return at_test_result("test_model_config");
}
