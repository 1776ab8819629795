/* An independent reader accepts our GGUF files: Hugging Face's own GGUF
 * parser (@huggingface/gguf, the npm package the Hub uses) reads the files
 * anytune export writes, and tests/js/check_gguf.mjs compares what it finds
 * with what this test expects: architecture, hyper-parameters, tokenizer
 * arrays, and the exact list of tensors with llama.cpp's names, ggml shapes
 * (innermost first) and types. The expectations are written here from the
 * model configs and llama.cpp's naming rules, not from our writer.
 *
 * The package is installed into tests/js/node_modules by scripts/setup.sh
 * (npm ci, the versions pinned by tests/js/package-lock.json). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base/file.h"
#include "base/log.h"
#include "export/export_job.h"
#include "model/config.h"
#include "testing.h"
#include "train/run_files.h"

enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q8_0 = 8, GGML_BF16 = 30 };

static char tmp_root[64];

static void add_tensor(cJSON *list, const char *name, int64_t ne0, int64_t ne1, int type)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "name", name);
    cJSON *s = cJSON_AddArrayToObject(t, "shape");
    cJSON_AddItemToArray(s, cJSON_CreateNumber((double)ne0));
    if (ne1 > 0) cJSON_AddItemToArray(s, cJSON_CreateNumber((double)ne1));
    cJSON_AddNumberToObject(t, "dtype", type);
    cJSON_AddItemToArray(list, t);
}

/* llama.cpp's tensors of a Llama-family model (its MODEL_TENSOR names), ggml
 * shapes = PyTorch shapes reversed; matrices of type mt, 1-D tensors F32. */
static cJSON *model_tensors2(const at_model_config *c, int mt, int down_type);
static cJSON *model_tensors(const at_model_config *c, int mt)
{
    return model_tensors2(c, mt, mt);
}

/* down_type: ffn_down's type (rows of I values: F16 when I is not a multiple
 * of 32 and mt is a block type, as llama.cpp's converter falls back). */
static cJSON *model_tensors2(const at_model_config *c, int mt, int down_type)
{
    cJSON *l = cJSON_CreateArray();
    int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, D = c->head_dim;
    int64_t q = c->num_attention_heads * D, kv = c->num_key_value_heads * D;
    char n[96];
    add_tensor(l, "token_embd.weight", H, V, mt);
    add_tensor(l, "output_norm.weight", H, 0, GGML_F32);
    if (!c->tie_word_embeddings) add_tensor(l, "output.weight", H, V, mt);
    for (int b = 0; b < c->num_hidden_layers; b++) {
#define T2(s, a, bb) (snprintf(n, sizeof n, "blk.%d." s, b), add_tensor(l, n, a, bb, mt))
#define T1(s, a) (snprintf(n, sizeof n, "blk.%d." s, b), add_tensor(l, n, a, 0, GGML_F32))
        T1("attn_norm.weight", H);
        T2("attn_q.weight", H, q);
        T2("attn_k.weight", H, kv);
        T2("attn_v.weight", H, kv);
        T2("attn_output.weight", q, H);
        T1("ffn_norm.weight", H);
        T2("ffn_gate.weight", H, I);
        T2("ffn_up.weight", H, I);
        snprintf(n, sizeof n, "blk.%d.ffn_down.weight", b);
        add_tensor(l, n, I, H, down_type);
        if (c->attn_qkv_bias) {
            T1("attn_q.bias", q);
            T1("attn_k.bias", kv);
            T1("attn_v.bias", kv);
        }
        if (c->qk_norm) {
            T1("attn_q_norm.weight", D);
            T1("attn_k_norm.weight", D);
        }
    }
    return l;
}

static cJSON *hparams(const at_model_config *c, const char *arch, int file_type)
{
    cJSON *m = cJSON_CreateObject();
    char k[96];
    cJSON_AddStringToObject(m, "general.architecture", arch);
    cJSON_AddStringToObject(m, "general.type", "model");
    cJSON_AddNumberToObject(m, "general.file_type", file_type);
#define HP(key, v) (snprintf(k, sizeof k, "%s." key, arch), cJSON_AddNumberToObject(m, k, (double)(v)))
    HP("embedding_length", c->hidden_size);
    HP("feed_forward_length", c->intermediate_size);
    HP("block_count", c->num_hidden_layers);
    HP("attention.head_count", c->num_attention_heads);
    HP("attention.head_count_kv", c->num_key_value_heads);
    HP("rope.dimension_count", c->head_dim);
    HP("rope.freq_base", (float)c->rope_theta);
    HP("attention.layer_norm_rms_epsilon", (float)c->rms_norm_eps);
    if (c->max_position_embeddings > 0) HP("context_length", c->max_position_embeddings);
    return m;
}

static cJSON *entry(const char *file, cJSON *meta, cJSON *tensors)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "file", file);
    cJSON_AddItemToObject(e, "metadata", meta);
    cJSON_AddItemToObject(e, "tensors", tensors);
    return e;
}

static char *run_export(const char *out_name, at_export_args *a, const char *file)
{
    char *out = at_path_join(tmp_root, out_name);
    a->output_dir = out;
    CHECK_OK(at_export_run(a));
    char *p = at_path_join(out, file);
    free(out);
    return p;
}

int main(void)
{
    at_log_set_level(AT_LOG_ERROR);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/at_export_js_XXXXXX");
    if (!mkdtemp(tmp_root)) return 1;
    cJSON *all = cJSON_CreateArray();

    /* 1. stories260K (llama2.c + tok512.bin) -> GGUF f32 with the tokenizer.
     * Sizes as stories260K.md documents them. */
    at_model_config s;
    at_model_config_init(&s);
    s.hidden_size = 64, s.intermediate_size = 172, s.num_hidden_layers = 5, s.num_attention_heads = 8;
    s.num_key_value_heads = 4, s.head_dim = 8, s.vocab_size = 512, s.tie_word_embeddings = 1;
    s.rms_norm_eps = 1e-5, s.rope_theta = 10000, s.max_position_embeddings = 512;
    at_export_args a1 = {.model = "tests/data/models/stories260K.bin", .tokenizer = "tests/data/goldens/tok512.bin",
                         .to = "gguf", .dtype = AT_F32};
    char *f1 = run_export("stories", &a1, "model-f32.gguf");
    cJSON *m1 = hparams(&s, "llama", 0);
    cJSON_AddStringToObject(m1, "tokenizer.ggml.model", "llama");
    cJSON_AddNumberToObject(m1, "tokenizer.ggml.bos_token_id", 1);
    cJSON_AddNumberToObject(m1, "tokenizer.ggml.eos_token_id", 2);
    cJSON_AddNumberToObject(m1, "tokenizer.ggml.unknown_token_id", 0);
    cJSON *e1 = entry(f1, m1, model_tensors(&s, GGML_F32));
    cJSON *al = cJSON_AddObjectToObject(e1, "array_lengths");
    cJSON_AddNumberToObject(al, "tokenizer.ggml.tokens", 512);
    cJSON_AddNumberToObject(al, "tokenizer.ggml.scores", 512);
    cJSON_AddNumberToObject(al, "tokenizer.ggml.token_type", 512);
    cJSON_AddItemToArray(all, e1);

    /* 1b. The same as Q8_0 (ffn_down rows of 172 values stay F16). */
    at_export_args a1q = a1;
    a1q.dtype = AT_Q8_0;
    char *f1q = run_export("stories_q8", &a1q, "model-q8_0.gguf");
    cJSON *m1q = hparams(&s, "llama", 7);
    cJSON_AddNumberToObject(m1q, "general.quantization_version", 2);
    cJSON_AddItemToArray(all, entry(f1q, m1q, model_tensors2(&s, GGML_Q8_0, GGML_F16)));

    /* 2. Qwen3 (q/k norm, head_dim 16 != 36/4) merged with its adapter, f16. */
    at_model_config q3;
    CHECK_OK(at_model_config_load("tests/data/goldens/qwen3_qknorm", &q3));
    at_export_args a2 = {.model = "tests/data/goldens/qwen3_qknorm", .adapters = "tests/data/export/qwen3_qknorm_lora",
                         .merge_lora = 1, .to = "gguf", .dtype = AT_F16};
    char *f2 = run_export("qwen3", &a2, "model-f16.gguf");
    cJSON *m2 = hparams(&q3, "qwen3", 1);
    cJSON_AddNumberToObject(m2, "qwen3.attention.key_length", 16);
    cJSON_AddNumberToObject(m2, "qwen3.attention.value_length", 16);
    cJSON_AddItemToArray(all, entry(f2, m2, model_tensors(&q3, GGML_F16)));

    /* 3. Qwen2 (q/k/v biases, tied, one KV head) as bf16. */
    at_model_config q2;
    CHECK_OK(at_model_config_load("tests/data/goldens/qwen2_bias_tied", &q2));
    at_export_args a3 = {.model = "tests/data/goldens/qwen2_bias_tied", .to = "gguf", .dtype = AT_BF16};
    char *f3 = run_export("qwen2", &a3, "model-bf16.gguf");
    cJSON_AddItemToArray(all, entry(f3, hparams(&q2, "qwen2", 32), model_tensors(&q2, GGML_BF16)));

    /* 4. A LoRA adapter alone as llama.cpp's adapter GGUF: lora_a ne {in, r},
     * lora_b ne {r, out} (llama-adapter.cpp's shape checks). */
    at_model_config g;
    CHECK_OK(at_model_config_load("tests/data/goldens/llama_gqa", &g));
    at_export_args a4 = {.model = "tests/data/goldens/llama_gqa", .adapters = "tests/data/export/llama_gqa_lora",
                         .to = "gguf", .dtype = AT_DTYPE_COUNT};
    char *f4 = run_export("adapter", &a4, "adapter-f32.gguf");
    cJSON *m4 = cJSON_CreateObject();
    cJSON_AddStringToObject(m4, "general.architecture", "llama");
    cJSON_AddStringToObject(m4, "general.type", "adapter");
    cJSON_AddStringToObject(m4, "adapter.type", "lora");
    cJSON_AddNumberToObject(m4, "adapter.lora.alpha", 8);
    cJSON *t4 = cJSON_CreateArray();
    static const char *const gg[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    int64_t H = g.hidden_size, I = g.intermediate_size, q = g.num_attention_heads * g.head_dim,
            kv = g.num_key_value_heads * g.head_dim;
    int64_t in[7] = {H, H, H, q, H, H, I}, outd[7] = {q, kv, kv, H, I, I, H};
    for (int b = 0; b < g.num_hidden_layers; b++)
        for (int m = 0; m < 7; m++) {
            char n[96];
            snprintf(n, sizeof n, "blk.%d.%s.weight.lora_a", b, gg[m]);
            add_tensor(t4, n, in[m], 4, GGML_F32);
            snprintf(n, sizeof n, "blk.%d.%s.weight.lora_b", b, gg[m]);
            add_tensor(t4, n, 4, outd[m], GGML_F32);
        }
    cJSON_AddItemToArray(all, entry(f4, m4, t4));

    /* The reader (scripts/setup.sh installs it from the lock file). */
    at_test_js_check(tmp_root, all, "@huggingface/gguf", "check_gguf.mjs", "@huggingface/gguf");

    free(f1);
    free(f1q);
    free(f2);
    free(f3);
    free(f4);
    cJSON_Delete(all);
    at_remove_tree(tmp_root);
    return at_test_result("test_export_gguf_js");
}
