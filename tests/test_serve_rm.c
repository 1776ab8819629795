/* Reward models outside training (train/reward_model.h) and served
 * (POST /v1/score, serve/score_request.h):
 *  - the three forms score alike: a full checkpoint (weights +
 *    score.safetensors) and its sequence-classification export (`anytune
 *    export --to hf`); a LoRA checkpoint over its base and its merged export
 *    (the adapter applies: its scores differ from the base's); an untied model
 *    whose sequence-classification folder has no lm_head;
 *  - a generative model is not a reward model (AT_ERR_NOT_FOUND), and the
 *    in-process scores rank nothing by accident (they differ pair to pair);
 *  - the server's scores, batched 2 sequences a forward, equal the in-process
 *    scores of the same folder scored one at a time, for one prompt with N
 *    replies and for N prompts with N replies; usage counts the tokens;
 *  - bad requests get OpenAI errors (400 with the field, 404 model, 405, 413,
 *    context_length_exceeded), the chat endpoints refuse a reward model and
 *    /v1/score refuses a generative one (model_not_supported).
 * Tolerances: the same f32 weights and tokens; batching changes only which
 * rows share a GEMM (the per-row sums keep their order in our kernels up to
 * the blocking of M), so scores agree to f32 rounding: 1e-5 · (1 + |r|). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "device/cpu/cpu_backend.h"
#include "export/export_hf.h"
#include "http_client.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "serve/server.h"
#include "train/reward_model.h"
#include "train/text_pipeline.h"
#include "testing.h"

#define BASE "demo/stories260K"
#define NP 5

static const char *prompts_text[NP] = {"Who is Lily?", "Tell me a story.", "Who is Lily?", "What did Tim see?",
                                       "Where is the park?"};
static const char *replies[NP] = {"Lily is a little girl who likes to play.", "Once upon a time there was a dog.",
                                  "She is a cat.", "Tim saw a big red ball in the sun and he was happy.", "Far."};

static int sh(const char *cmd)
{
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static double tol(double r) { return 1e-5 * (1 + fabs(r)); }

/* A score head [1, hidden] with values of either sign, written as DIR/score.safetensors. */
static void write_head(const char *dir, int64_t H, uint32_t salt)
{
    int64_t shape[2] = {1, H};
    at_tensor *t = NULL;
    CHECK_OK(at_tensor_zeros(at_cpu_backend(), AT_F32, 2, shape, "score.weight", &t));
    if (!t) return;
    float *w = at_tensor_data(t);
    for (int64_t k = 0; k < H; k++) w[k] = 0.3f * sinf((float)(k * 7 + salt));
    char *p = at_path_join(dir, "score.safetensors");
    const at_tensor *ts[1] = {t};
    CHECK_OK(at_safetensors_write(p, ts, NULL, 1, NULL, 0));
    free(p);
    at_tensor_free(t);
}

static at_reward_model *open_rm(const char *model, const char *adapter, int batch)
{
    at_bundle_opts o = {0};
    o.model = model;
    o.dtype = AT_LOAD_KEEP_DTYPE;
    const char *items[1] = {adapter};
    o.adapters = items;
    o.n_adapters = adapter ? 1 : 0;
    at_reward_model *rm = NULL;
    at_status st = at_reward_model_open(&o, batch, &rm);
    CHECK_MSG(st == AT_OK, "%s%s%s: %s", model, adapter ? " + " : "", adapter ? adapter : "", at_last_error());
    return rm;
}

static void score_all(at_reward_model *rm, double *r)
{
    cJSON *p[NP];
    for (int i = 0; i < NP; i++) p[i] = cJSON_CreateString(prompts_text[i]);
    for (int i = 0; i < NP; i++) r[i] = NAN;
    if (rm) CHECK_OK(at_reward_model_score(rm, (const cJSON *const *)p, replies, NP, r));
    for (int i = 0; i < NP; i++) cJSON_Delete(p[i]);
}

static int same(const double *a, const double *b, const char *what)
{
    int ok = 1;
    for (int i = 0; i < NP; i++) ok &= fabs(a[i] - b[i]) <= tol(a[i]);
    CHECK_MSG(ok, "%s: %.9g %.9g %.9g / %.9g %.9g %.9g", what, a[0], a[1], a[2], b[0], b[1], b[2]);
    return ok;
}

/* POST body; the parsed answer (NULL if not JSON) and its status. */
static cJSON *post(int port, const char *path, const char *body, int *status)
{
    http_resp r;
    *status = 0;
    if (!http(port, "POST", path, NULL, body, &r)) return NULL;
    *status = r.status;
    cJSON *j = cJSON_Parse(r.body);
    free(r.body);
    return j;
}

static const char *err_field(const cJSON *j, const char *key)
{
    const cJSON *e = cJSON_GetObjectItem(j, "error");
    const cJSON *v = e ? cJSON_GetObjectItem(e, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : "";
}

static void expect(int port, const char *path, const char *body, int status, const char *param, const char *code)
{
    int got = 0;
    cJSON *j = post(port, path, body, &got);
    CHECK_MSG(got == status && j && !strcmp(err_field(j, "param"), param ? param : "") &&
                  (!code || !strcmp(err_field(j, "code"), code)),
              "POST %s %.80s: status %d (want %d), param '%s' (want '%s'), code '%s'", path, body, got, status,
              j ? err_field(j, "param") : "?", param ? param : "", j ? err_field(j, "code") : "?");
    cJSON_Delete(j);
}

static void test_served(const char *seqcls, const double *want)
{
    at_bundle_opts bo = {0};
    bo.model = seqcls;
    bo.dtype = AT_LOAD_KEEP_DTYPE;
    at_bundle *b = NULL;
    at_reward_model *rm = NULL;
    at_server *s = NULL;
    CHECK_OK(at_bundle_load(&bo, &b));
    if (b) CHECK_OK(at_reward_model_attach(b, seqcls, 2, &rm));
    at_server_opts o = {0};
    o.max_batch_size = 2;
    o.max_score_pairs = 6;
    o.max_body_bytes = 16 * 1024;
    o.served_model_name = "rm";
    o.reward_model = rm;
    if (rm) CHECK_OK(at_server_start(b, &o, &s));
    if (!s) goto done;
    int port = at_server_port(s), status = 0;

    /* N prompts, N replies (pairwise), in one request: batches of 2, 2, 1 */
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "model", "rm");
    cJSON_AddItemToObject(req, "text_1", cJSON_CreateStringArray(prompts_text, NP));
    cJSON_AddItemToObject(req, "text_2", cJSON_CreateStringArray(replies, NP));
    char *body = cJSON_PrintUnformatted(req);
    cJSON *j = post(port, "/v1/score", body, &status);
    CHECK_MSG(status == 200 && j, "/v1/score: status %d", status);
    const cJSON *data = j ? cJSON_GetObjectItem(j, "data") : NULL;
    CHECK(cJSON_GetArraySize(data) == NP);
    CHECK(j && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "object")), "list"));
    double worst = 0;
    for (int i = 0; i < NP && i < cJSON_GetArraySize(data); i++) {
        const cJSON *e = cJSON_GetArrayItem(data, i);
        double got = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "score"));
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(e, "index")) == i);
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "object")), "score"));
        CHECK_MSG(fabs(got - want[i]) <= tol(want[i]), "pair %d: served %.9g, in-process %.9g", i, got, want[i]);
        worst = fmax(worst, fabs(got - want[i]));
    }
    /* usage: every pair's tokens */
    long long tokens = 0;
    for (int i = 0; i < NP; i++) {
        cJSON *pr = cJSON_CreateString(prompts_text[i]);
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(at_reward_model_encode(rm, pr, replies[i], &ids, &n));
        tokens += (long long)n;
        free(ids);
        cJSON_Delete(pr);
    }
    const cJSON *u = j ? cJSON_GetObjectItem(j, "usage") : NULL;
    CHECK_MSG(cJSON_GetNumberValue(cJSON_GetObjectItem(u, "prompt_tokens")) == (double)tokens,
              "usage.prompt_tokens %g, want %lld", cJSON_GetNumberValue(cJSON_GetObjectItem(u, "prompt_tokens")),
              tokens);
    printf("served /v1/score (5 pairs, batches of 2): worst |served - in-process| %.2e, %lld tokens\n", worst, tokens);
    cJSON_Delete(j);
    free(body);
    cJSON_Delete(req);

    /* one prompt, three replies: pairs 0 and 2 above share the prompt "Who is Lily?" */
    j = post(port, "/score",
             "{\"text_1\": \"Who is Lily?\", \"text_2\": [\"Lily is a little girl who likes to play.\", \"x\", "
             "\"She is a cat.\"]}",
             &status);
    data = j ? cJSON_GetObjectItem(j, "data") : NULL;
    CHECK_MSG(status == 200 && cJSON_GetArraySize(data) == 3, "/score 1 x 3: status %d", status);
    if (cJSON_GetArraySize(data) == 3) {
        double a = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(data, 0), "score"));
        double c = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(data, 2), "score"));
        CHECK_MSG(fabs(a - want[0]) <= tol(want[0]) && fabs(c - want[2]) <= tol(want[2]),
                  "1 x N: %.9g %.9g, want %.9g %.9g", a, c, want[0], want[2]);
    }
    cJSON_Delete(j);

    /* bad requests */
    expect(port, "/v1/score", "{\"text_1\": \"a\"", 400, NULL, NULL);              /* not JSON */
    expect(port, "/v1/score", "[1, 2]", 400, NULL, NULL);                          /* not an object */
    expect(port, "/v1/score", "{\"text_1\": \"a\"}", 400, "text_2", NULL);         /* missing */
    expect(port, "/v1/score", "{\"text_1\": 3, \"text_2\": \"b\"}", 400, "text_1", NULL);
    expect(port, "/v1/score", "{\"text_1\": \"a\", \"text_2\": []}", 400, "text_2", NULL);
    expect(port, "/v1/score", "{\"text_1\": \"a\", \"text_2\": [\"b\", 7]}", 400, "text_2", NULL);
    expect(port, "/v1/score", "{\"text_1\": [\"a\", \"b\"], \"text_2\": [\"c\", \"d\", \"e\"]}", 400, "text_1", NULL);
    expect(port, "/v1/score",
           "{\"text_1\": \"a\", \"text_2\": [\"1\", \"2\", \"3\", \"4\", \"5\", \"6\", \"7\"]}", 400, "text_2",
           NULL); /* over max_score_pairs */
    expect(port, "/v1/score", "{\"model\": \"other\", \"text_1\": \"a\", \"text_2\": \"b\"}", 404, "model",
           "model_not_found");
    expect(port, "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 400, "model",
           "model_not_supported");
    expect(port, "/v1/completions", "{\"prompt\": \"hi\"}", 400, "model", "model_not_supported");
    /* a reply longer than the context (512 tokens) */
    {
        size_t n = 6000;
        char *big = malloc(n + 64);
        if (big) {
            int k = snprintf(big, n + 64, "{\"text_1\": \"a\", \"text_2\": \"");
            for (size_t i = 0; i < 1500; i++) k += snprintf(big + k, n + 64 - (size_t)k, "sun ");
            snprintf(big + k, n + 64 - (size_t)k, "\"}");
            expect(port, "/v1/score", big, 400, "text_2", "context_length_exceeded");
        }
        free(big);
    }
    /* a body over max_body_bytes */
    {
        size_t n = 20000;
        char *big = malloc(n + 64);
        if (big) {
            memset(big, ' ', n + 63);
            memcpy(big, "{\"text_1\": \"a\", \"text_2\": \"b\"}", 30);
            big[n + 63] = 0;
            expect(port, "/v1/score", big, 413, NULL, "request_too_large");
        }
        free(big);
    }
    http_resp r;
    CHECK(http(port, "GET", "/v1/score", NULL, NULL, &r) && r.status == 405);
    free(r.body);
done:
    at_server_stop(s, 5);
    at_reward_model_free(rm);
    at_bundle_free(b);
}

/* /v1/score on a generative model */
static void test_generative(void)
{
    at_bundle_opts bo = {0};
    bo.model = BASE;
    bo.dtype = AT_LOAD_KEEP_DTYPE;
    at_bundle *b = NULL;
    at_reward_model *rm = NULL;
    CHECK_OK(at_bundle_load(&bo, &b));
    if (!b) return;
    CHECK(at_reward_model_attach(b, BASE, 1, &rm) == AT_ERR_NOT_FOUND && rm == NULL);
    at_server_opts o = {0};
    at_server *s = NULL;
    CHECK_OK(at_server_start(b, &o, &s));
    if (s) expect(at_server_port(s), "/v1/score", "{\"text_1\": \"a\", \"text_2\": \"b\"}", 400, "model",
                  "model_not_supported");
    at_server_stop(s, 5);
    at_bundle_free(b);
}

/* The tokens scored for a pair are those training reads for it: the chosen
 * row of at_encode_preference through the trainer's text pipeline. */
static void test_same_tokens_as_training(at_reward_model *rm, const char *model)
{
    at_bundle_opts bo = {0};
    bo.model = model;
    bo.dtype = AT_LOAD_KEEP_DTYPE;
    at_bundle *b = NULL;
    CHECK_OK(at_bundle_load(&bo, &b));
    if (!b || !rm) {
        at_bundle_free(b);
        return;
    }
    at_text_pipeline tp;
    at_encoder enc;
    CHECK_OK(at_text_pipeline_init(&tp, b->tokenizer, b->tmpl, 1));
    at_text_pipeline_encoder(&tp, &enc);
    for (int i = 0; i < NP; i++) {
        at_message user = {AT_ROLE_USER, prompts_text[i], NULL, -1}, reply = {AT_ROLE_ASSISTANT, replies[i], NULL, -1};
        at_sample smp = {0};
        smp.kind = AT_SAMPLE_PREFERENCE;
        smp.source = "test";
        smp.messages = (at_messages){&user, 1};
        smp.chosen = smp.rejected = (at_messages){&reply, 1};
        smp.label = -1;
        at_encoded c = {0}, r = {0};
        int dropped = 0;
        CHECK_OK(at_encode_preference(&enc, &smp, &c, &r, &dropped));
        cJSON *pr = cJSON_CreateString(prompts_text[i]);
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(at_reward_model_encode(rm, pr, replies[i], &ids, &n));
        CHECK_MSG(n == c.n && c.ids && ids && !memcmp(ids, c.ids, n * sizeof *ids),
                  "pair %d: scored on %zu tokens, training reads %zu (or others)", i, n, c.n);
        free(ids);
        cJSON_Delete(pr);
        at_encoded_free(&c);
        at_encoded_free(&r);
    }
    at_text_pipeline_free(&tp);
    at_bundle_free(b);
}

int main(void)
{
    const char *bin = getenv("ANYTUNE_BIN");
    CHECK_MSG(bin != NULL, "ANYTUNE_BIN is not set");
    if (!bin) return at_test_result("test_serve_rm");
    char T[] = "/tmp/anytune-serve-rm-XXXXXX";
    CHECK(mkdtemp(T) != NULL);
    char ck[256], ex[256], lora[256], ex2[256], un[256], unx[256], cmd[1400];
    snprintf(ck, sizeof ck, "%s/ckpt", T);
    snprintf(ex, sizeof ex, "%s/seqcls", T);
    snprintf(lora, sizeof lora, "%s/lora", T);
    snprintf(ex2, sizeof ex2, "%s/seqcls-lora", T);
    snprintf(un, sizeof un, "%s/untied", T);
    snprintf(unx, sizeof unx, "%s/untied-seqcls", T);
    at_model_config cfg;
    CHECK_OK(at_model_config_load(BASE, &cfg));
    int64_t H = cfg.hidden_size;

    /* a full checkpoint: the base's files and a head; its export */
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp " BASE "/* %s/", ck, ck);
    CHECK(sh(cmd) == 0);
    write_head(ck, H, 1);
    snprintf(cmd, sizeof cmd, "'%s' export --model %s --to hf --output_dir %s > %s/export.out 2>&1", bin, ck, ex, T);
    CHECK_MSG(sh(cmd) == 0, "export of the checkpoint failed: see %s/export.out", T);

    /* a LoRA checkpoint (B non-zero, so it changes the scores) with its head; its merged export */
    CHECK(mkdir(lora, 0700) == 0);
    {
        at_bundle_opts bo = {0};
        bo.model = BASE;
        bo.dtype = AT_LOAD_KEEP_DTYPE;
        at_bundle *b = NULL;
        at_adapter *ad = NULL;
        CHECK_OK(at_bundle_load(&bo, &b));
        if (b) CHECK_OK(at_adapter_new(&b->decoder->cfg, b->decoder->be, 4, 8.0, 0.0, 0, (1u << AT_MOD_COUNT) - 1, 3,
                                       &ad));
        for (int l = 0; ad && l < ad->n_layers; l++)
            for (int m = 0; m < AT_MOD_COUNT; m++) {
                at_lora_pair *pr = at_adapter_pair(ad, l, (at_module)m);
                float *d = at_tensor_data(pr->B);
                for (int64_t i = 0; i < at_tensor_numel(pr->B); i++) d[i] = 0.2f * (float)((i * 7 + l * 3 + m) % 11 - 5) / 5;
            }
        if (ad) CHECK_OK(at_adapter_save(ad, lora));
        write_head(lora, H, 1); /* the checkpoint's head: only the adapter differs */
        at_adapter_free(ad);
        at_bundle_free(b);
    }
    snprintf(cmd, sizeof cmd, "'%s' export --model " BASE " --adapters %s --merge_lora true --to hf --output_dir %s > "
             "%s/export2.out 2>&1", bin, lora, ex2, T);
    CHECK_MSG(sh(cmd) == 0, "export of the LoRA checkpoint failed: see %s/export2.out", T);

    /* an untied model: its causal-LM folder + head file, and its sequence-classification folder (no lm_head) */
    {
        at_model_config uc = cfg;
        uc.tie_word_embeddings = 0;
        at_decoder_weights *w = NULL;
        at_tensor *head = NULL;
        int64_t shape[2] = {1, H};
        CHECK_OK(at_decoder_weights_random(&uc, at_cpu_backend(), AT_F32, 5, &w));
        CHECK_OK(at_tensor_zeros(at_cpu_backend(), AT_F32, 2, shape, "score.weight", &head));
        if (w && head) {
            float *hw = at_tensor_data(head);
            for (int64_t k = 0; k < H; k++) hw[k] = 0.3f * sinf((float)(k * 7 + 3));
            at_export_hf_opts o = {.dtype = AT_DTYPE_COUNT, .tokenizer_dir = BASE};
            CHECK_OK(at_export_hf(w, un, &o));
            write_head(un, H, 3);
            o.score = head;
            CHECK_OK(at_export_hf(w, unx, &o));
            snprintf(cmd, sizeof cmd, "cp " BASE "/tokenizer.bin %s/ && cp " BASE "/tokenizer.bin %s/", un, unx);
            CHECK(sh(cmd) == 0);
            snprintf(cmd, sizeof cmd, "grep -q lm_head.weight %s/model.safetensors", unx);
            CHECK_MSG(sh(cmd) != 0, "the untied sequence-classification folder has an lm_head");
        }
        at_tensor_free(head);
        at_decoder_weights_free(w);
    }

    double r_ck[NP], r_ex[NP], r_lora[NP], r_ex2[NP], r_un[NP], r_unx[NP];
    at_reward_model *m;
    m = open_rm(ck, NULL, 3);
    score_all(m, r_ck);
    test_same_tokens_as_training(m, ck);
    at_reward_model_free(m);
    m = open_rm(ex, NULL, 1);
    score_all(m, r_ex);
    at_reward_model_free(m);
    m = open_rm(BASE, lora, 2);
    score_all(m, r_lora);
    at_reward_model_free(m);
    m = open_rm(ex2, NULL, 4);
    score_all(m, r_ex2);
    at_reward_model_free(m);
    m = open_rm(un, NULL, 5);
    score_all(m, r_un);
    at_reward_model_free(m);
    m = open_rm(unx, NULL, 1);
    score_all(m, r_unx);
    at_reward_model_free(m);
    printf("rewards (checkpoint / its export): %.6f %.6f %.6f %.6f %.6f\n", r_ck[0], r_ck[1], r_ck[2], r_ck[3], r_ck[4]);
    printf("rewards (LoRA checkpoint / merged export): %.6f %.6f %.6f %.6f %.6f\n", r_lora[0], r_lora[1], r_lora[2],
           r_lora[3], r_lora[4]);
    same(r_ck, r_ex, "full checkpoint vs its sequence-classification export");
    same(r_lora, r_ex2, "LoRA checkpoint vs its merged export");
    same(r_un, r_unx, "untied model + head file vs its sequence-classification folder (no lm_head)");
    /* the pairs score differently, and the adapter changes the scores (it is applied) */
    double spread = 0, moved = 0;
    for (int i = 1; i < NP; i++) spread = fmax(spread, fabs(r_ck[i] - r_ck[0]));
    for (int i = 0; i < NP; i++) moved = fmax(moved, fabs(r_lora[i] - r_ck[i]));
    CHECK_MSG(spread > 1e-3, "every pair has the same reward (%g)", spread);
    CHECK_MSG(moved > 1e-3, "the LoRA checkpoint scores as the base (%g)", moved);

    test_served(ex, r_ex);
    test_generative();

    snprintf(cmd, sizeof cmd, "rm -rf %s", T);
    sh(cmd);
    return at_test_result("test_serve_rm");
}
