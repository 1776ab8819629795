/* An independent reader accepts the Hugging Face tokenizer files we write:
 * transformers.js (@huggingface/transformers, Hugging Face's JavaScript port
 * of transformers and tokenizers) loads the folders that `anytune export --to
 * hf` writes from GGUF files and llama2.c checkpoints with
 * AutoTokenizer.from_pretrained (local folder, no network), and
 * tests/js/check_hf_tokenizer.mjs checks that it
 *   - encodes llama.cpp's tokenizer test vectors into the ids Hugging Face's
 *     Python tokenizers gave (the .out files): Llama 2 (from a model GGUF and
 *     a vocabulary-only GGUF), TinyLlama's special-token cases, GPT-2 (a
 *     vocabulary-only GGUF), Llama 3, Qwen2 and Falcon (byte-level families);
 *   - adds BOS as the GGUF's add_bos_token says, decodes the ids back to the
 *     text, and renders the GGUF's chat template with the special tokens of
 *     tokenizer_config.json.
 * stories260K has no published vectors: there the expected ids are those of
 * the SentencePiece-score tokenizer the GGUF arrays give (our llama.cpp-style
 * encoder, checked against llama2.c's run.c elsewhere), so transformers.js
 * running the merges we derived from the scores must agree with it.
 *
 * A full fine-tuning checkpoint (issue 21.3: "the folder loads in
 * transformers"; Debian has no python3-transformers) is read the same way:
 * AutoTokenizer and AutoConfig load it, its tokenizer encodes as the demo's
 * tokenizer.bin it was trained with, and model.safetensors holds exactly the
 * parameters transformers' model class builds from that config.
 *
 * The package is installed into tests/js/node_modules by scripts/setup.sh
 * (npm ci, pinned by tests/js/package-lock.json; tests/js/.npmrc skips
 * onnxruntime-node's download of GPU binaries). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "export/export_gguf.h"
#include "export/export_job.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/weights.h"
#include "testing.h"
#include "text/tokenizer.h"
#include "text/tokenizer_hf_export.h"
#include "train/run_files.h"
#include "train/trainer.h"

#define TOKDATA "tests/data/tokenizers/"
#define SEP "\n__ggml_vocab_test__\n"

static char tmp_root[64];

static cJSON *ids_json(const int32_t *ids, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* llama.cpp's vectors `vec` as [{"text", "ids"}]. With `tok`, the ids are
 * tok's encoding of the texts instead of the .out file's. */
static cJSON *vector_cases(const char *vec, const at_tokenizer *tok)
{
    char path[256], *inp = NULL, *outp = NULL;
    size_t il = 0, ol = 0;
    cJSON *cases = cJSON_CreateArray();
    snprintf(path, sizeof path, TOKDATA "ggml-vocab-%s.gguf.inp", vec);
    CHECK_OK(at_read_file(path, &inp, &il));
    snprintf(path, sizeof path, TOKDATA "ggml-vocab-%s.gguf.out", vec);
    CHECK_OK(at_read_file(path, &outp, &ol));
    char *line = outp;
    for (char *p = inp; inp && outp && p < inp + il;) {
        char *q = strstr(p, SEP);
        if (!q) break;
        cJSON *c = cJSON_CreateObject();
        char *text = strndup(p, (size_t)(q - p));
        cJSON_AddStringToObject(c, "text", text);
        char *nl = line ? strchr(line, '\n') : NULL;
        if (nl) *nl = '\0';
        if (tok) {
            int32_t *ids = NULL;
            size_t n = 0;
            CHECK_OK(at_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n));
            cJSON_AddItemToObject(c, "ids", ids_json(ids, n));
            free(ids);
        } else {
            cJSON *ids = cJSON_AddArrayToObject(c, "ids");
            for (char *t = line ? strtok(line, " ") : NULL; t; t = strtok(NULL, " "))
                cJSON_AddItemToArray(ids, cJSON_CreateNumber(atoi(t)));
        }
        cJSON_AddItemToArray(cases, c);
        free(text);
        line = nl ? nl + 1 : NULL;
        p = q + strlen(SEP);
    }
    free(inp);
    free(outp);
    return cases;
}

static cJSON *entry(const char *dir, cJSON *cases, int decode)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "dir", dir);
    cJSON_AddItemToObject(e, "cases", cases);
    cJSON_AddBoolToObject(e, "decode", decode);
    return e;
}

/* The case of `cases` whose text is `text`, with the BOS id before its ids:
 * what encoding with special tokens must give. */
static void add_with_special(cJSON *e, const cJSON *cases, const char *text, int bos)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        if (strcmp(cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring, text) != 0) continue;
        cJSON *w = cJSON_AddObjectToObject(e, "with_special");
        cJSON_AddStringToObject(w, "text", text);
        cJSON *ids = cJSON_AddArrayToObject(w, "ids");
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(bos));
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(c, "ids"))
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(x->valuedouble));
        return;
    }
    CHECK_MSG(0, "no case \"%s\"", text);
}

static int64_t gguf_int(const char *path, const char *key)
{
    at_gguf *g = NULL;
    int64_t v = -1;
    CHECK_OK(at_gguf_open(path, &g));
    if (g) CHECK_OK(at_gguf_get_int(g, key, &v));
    at_gguf_close(g);
    return v;
}

static char *export_hf(const char *name, const char *model, const char *tokenizer)
{
    char *out = at_path_join(tmp_root, name);
    at_export_args a = {.model = model, .tokenizer = tokenizer, .to = "hf", .output_dir = out,
                        .dtype = AT_DTYPE_COUNT};
    CHECK_OK(at_export_run(&a));
    return out;
}

/* A folder written by at_tokenizer_hf_write from a GGUF vocabulary or a
 * tokenizer folder. */
static char *write_hf(const char *name, const char *gguf, const char *folder)
{
    char *out = at_path_join(tmp_root, name);
    at_tokenizer *t = NULL;
    at_gguf *g = NULL;
    if (gguf) {
        CHECK_OK(at_gguf_open(gguf, &g));
        if (g) CHECK_OK(at_export_gguf_read_tokenizer(g, &t));
    } else {
        CHECK_OK(at_tokenizer_load(folder, NULL, &t));
    }
    CHECK_OK(at_mkdirs(out));
    if (t) CHECK_OK(at_tokenizer_hf_write(t, NULL, out));
    at_tokenizer_free(t);
    at_gguf_close(g);
    return out;
}

/* A small random model GGUF with stories260K's vocabulary and a chat
 * template, exported to a Hugging Face folder. */
static char *chat_model(const char *tmpl)
{
    at_tokenizer *t = NULL;
    at_decoder_weights *w = NULL;
    char *gguf = at_path_join(tmp_root, "chat.gguf"), *out = NULL;
    CHECK_OK(at_tokenizer_load("tests/data/goldens/tok512.bin", NULL, &t));
    if (t) {
        at_model_config c;
        at_model_config_init(&c);
        snprintf(c.model_type, sizeof c.model_type, "llama");
        c.hidden_size = 8, c.intermediate_size = 8, c.num_hidden_layers = 1, c.num_attention_heads = 2;
        c.num_key_value_heads = 2, c.head_dim = 4, c.rms_norm_eps = 1e-5, c.max_position_embeddings = 64;
        c.tie_word_embeddings = 1;
        c.vocab_size = (int)at_tokenizer_vocab_size(t);
        CHECK_OK(at_decoder_weights_random(&c, NULL, AT_F32, 1, &w));
        at_export_gguf_opts o = {.quant = AT_F32, .tok = t, .chat_template = tmpl};
        if (w) CHECK_OK(at_export_gguf_model(w, gguf, &o));
        out = export_hf("chat", gguf, NULL);
    }
    at_decoder_weights_free(w);
    at_tokenizer_free(t);
    free(gguf);
    return out;
}

/* A full fine-tuning checkpoint of the demo model (2 steps): the folder
 * stands alone (issue 21.3), so it must load as a model in transformers. */
static char *full_checkpoint(void)
{
    at_train_args a;
    at_train_result r;
    char out[128];
    snprintf(out, sizeof out, "%s/full", tmp_root);
    at_test_train_args(&a, "demo/stories260K", "demo/identity.json", out);
    a.full = 1;
    a.max_steps = 2;
    CHECK_OK(at_train_run(&a, NULL, &r));
    return r.run_dir[0] ? at_path_join(r.run_dir, "checkpoint-2") : NULL;
}

int main(void)
{
    at_log_set_level(AT_LOG_ERROR);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/at_tokhf_js_XXXXXX");
    if (!mkdtemp(tmp_root)) return 1;
    cJSON *all = cJSON_CreateArray();

    /* Llama 2's vocabulary in a model GGUF: the vectors, BOS, decode; and
     * TinyLlama's cases with </s> in the text. */
    const char *l2 = "tests/data/models/llama-2-tiny-random.gguf";
    char *d1 = export_hf("llama-2-tiny", l2, NULL);
    cJSON *c1 = vector_cases("llama-spm", NULL);
    cJSON *e1 = entry(d1, c1, 1);
    add_with_special(e1, c1, "Hello world", (int)gguf_int(l2, "tokenizer.ggml.bos_token_id"));
    cJSON_AddItemToArray(all, e1);
    cJSON_AddItemToArray(all, entry(d1, vector_cases("tinyllama", NULL), 0));

    /* the same vocabulary from llama.cpp's vocabulary-only GGUF */
    char *d2 = write_hf("llama-spm", TOKDATA "ggml-vocab-llama-spm.gguf", NULL);
    cJSON_AddItemToArray(all, entry(d2, vector_cases("llama-spm", NULL), 1));

    /* stories260K: merges derived from its scores vs the score encoder */
    at_tokenizer *sp = NULL;
    at_gguf *sg = NULL;
    CHECK_OK(at_gguf_open("tests/data/models/stories260K.gguf", &sg));
    if (sg) CHECK_OK(at_export_gguf_read_tokenizer(sg, &sp));
    char *d3 = export_hf("stories260K", "tests/data/models/stories260K.gguf", NULL);
    if (sp) cJSON_AddItemToArray(all, entry(d3, vector_cases("llama-spm", sp), 1));
    at_tokenizer_free(sp);
    at_gguf_close(sg);

    /* byte-level: GPT-2 from llama.cpp's GGUF, and the other families */
    char *d4 = write_hf("gpt-2", "tests/data/tokexport/ggml-vocab-gpt-2.gguf", NULL);
    cJSON_AddItemToArray(all, entry(d4, vector_cases("gpt-2", NULL), 1));
    char *d5 = write_hf("llama-bpe", NULL, TOKDATA "llama3");
    cJSON_AddItemToArray(all, entry(d5, vector_cases("llama-bpe", NULL), 1));
    char *d6 = write_hf("qwen2", NULL, TOKDATA "qwen2");
    cJSON_AddItemToArray(all, entry(d6, vector_cases("qwen2", NULL), 0)); /* NFC: not every text decodes back */
    char *d7 = write_hf("falcon", NULL, TOKDATA "falcon");
    cJSON_AddItemToArray(all, entry(d7, vector_cases("falcon", NULL), 1));

    /* The GGUF's chat template, rendered with tokenizer_config's tokens; the
     * expected text follows from the template by hand. */
    char *d8 = chat_model("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}");
    if (d8) {
        cJSON *e8 = entry(d8, cJSON_CreateArray(), 0);
        cJSON *chat = cJSON_AddObjectToObject(e8, "chat");
        cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", "Hi");
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(chat, "text", "<|user|>Hi</s><|assistant|>");
        cJSON_AddItemToArray(all, e8);
    }

    /* A full fine-tuning checkpoint: its config and weights read as the
     * model transformers builds, its tokenizer (written from the demo's
     * llama2.c tokenizer.bin) encodes as the one it was trained with. */
    char *d9 = full_checkpoint();
    at_tokenizer *dt = NULL;
    CHECK_OK(at_tokenizer_load("demo/stories260K/tokenizer.bin", NULL, &dt));
    if (d9 && dt) {
        cJSON *e9 = entry(d9, vector_cases("llama-spm", dt), 1);
        cJSON_AddBoolToObject(e9, "model", 1);
        cJSON_AddItemToArray(all, e9);
    }
    at_tokenizer_free(dt);

    /* The reader (scripts/setup.sh installs it from the lock file). */
    at_test_js_check(tmp_root, all, "@huggingface/transformers", "check_hf_tokenizer.mjs", "transformers.js");

    free(d1);
    free(d2);
    free(d3);
    free(d4);
    free(d5);
    free(d6);
    free(d7);
    free(d8);
    free(d9);
    cJSON_Delete(all);
    at_remove_tree(tmp_root);
    return at_test_result("test_tokenizer_hf_js");
}
