/* anytune eval against tools/make_eval_goldens.py (tests/data/eval/goldens.json):
 * the CSV reader on real MMLU / C-Eval files, LLaMA-Factory's prompts
 * through the demo model's chat template byte for byte, token ids, the
 * choice logits of torch's forward, predictions and accuracies, and the
 * loss / perplexity of a text and a chat dataset; then the error messages
 * and the command line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "eval/loss_eval.h"
#include "eval/mc_bench.h"
#include "eval/mc_csv.h"
#include "eval/mc_eval.h"
#include "infer/bundle.h"
#include "model/loader.h"
#include "testing.h"

#define DATA "tests/data/eval"
#define MODEL "demo/stories260K"

static cJSON *golden;
static char tmp_root[64];

static int ids_equal(const int32_t *ids, size_t n, const cJSON *want)
{
    if (!cJSON_IsArray(want) || (size_t)cJSON_GetArraySize(want) != n) return 0;
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, want) if (ids[i++] != (int32_t)v->valuedouble) return 0;
    return 1;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* ---- the CSV reader on the real files ---- */

static void test_csv_counts(void)
{
    const cJSON *counts = cJSON_GetObjectItem(golden, "csv_counts"), *c;
    int files = 0;
    cJSON_ArrayForEach(c, counts) {
        char path[256];
        snprintf(path, sizeof path, DATA "/%s", c->string);
        at_mc_file f;
        CHECK_OK(at_mc_csv_load(path, &f));
        CHECK_MSG(f.n == (size_t)c->valuedouble, "%s: %zu questions, Python's csv reads %d", path, f.n,
                  (int)c->valuedouble);
        at_mc_file_free(&f);
        files++;
    }
    CHECK(files == 12);
    /* a record with a doubled quote and a line break inside a quoted field */
    at_mc_file f;
    CHECK_OK(at_mc_csv_load(DATA "/bad/nodev/val/solo_val.csv", &f));
    CHECK(f.n == 2);
    if (f.n == 2) {
        CHECK(!strcmp(f.items[1].question, "Which, of these \"quoted\"\nanswers"));
        CHECK(f.items[1].line == 2 && f.items[1].answer == 0 && !strcmp(f.items[1].choices[3], "w"));
        CHECK(f.items[0].answer == 3);
    }
    at_mc_file_free(&f);
}

/* ---- bad input: the message names the file and the line ---- */

static void expect_csv_error(const char *data, const char *want)
{
    at_mc_file f;
    at_status st = at_mc_csv_parse(data, strlen(data), "t.csv", &f);
    CHECK_MSG(st == AT_ERR_FORMAT, "parsing %s succeeded", data);
    CHECK_MSG(strstr(at_last_error(), want) != NULL, "error '%s' lacks '%s'", at_last_error(), want);
    CHECK(f.n == 0 && f.items == NULL);
}

static void test_errors(void)
{
    expect_csv_error("q,a,b,c,d,A\nq2,a,b,c,d,E\n", "t.csv:2: answer 'E' is not one of A, B, C, D");
    expect_csv_error("q,a,b,c,d,A\n\nq2,a,b,c,d\n", "t.csv:3: 5 fields");
    expect_csv_error("q,a,b,c,d,A\n\"open,a,b,c,d,A\nmore\n", "t.csv:2: a quoted field opened here is never closed");
    expect_csv_error("\"q\"x,a,b,c,d,A\n", "t.csv:1: text after the closing quote");
    expect_csv_error("id,question,A,B,D,answer\n0,q,a,b,d,A\n", "t.csv:1: the header has no column 'C'");
    expect_csv_error("id,question,A,B,C,D,answer\n0,q,a,b,c,d,A,extra\n", "t.csv:2: 8 fields, the header has 7");
    expect_csv_error("id,question,A,B,C,D,answer\n", "t.csv: no questions");
    expect_csv_error("", "t.csv: no questions");
    expect_csv_error("q,a,b,c,d,\n", "t.csv:1: answer '' is not one of");
    /* header, CRLF, BOM, blank lines, answer with spaces */
    const char *ok = "\xEF\xBB\xBFid,Question,A,B,C,D,Answer,explanation\r\n\r\n0,\"x,\r\ny\",1,2,3,4, C ,why\r\n";
    at_mc_file f;
    CHECK_OK(at_mc_csv_parse(ok, strlen(ok), "ok.csv", &f));
    CHECK(f.n == 1 && f.items && !strcmp(f.items[0].question, "x,\r\ny") && f.items[0].answer == 2 &&
          f.items[0].line == 3);
    at_mc_file_free(&f);

    at_mc_bench b;
    char *dir = NULL;
    CHECK_FAILS(at_mc_bench_find("no_such_benchmark", &dir), AT_ERR_NOT_FOUND);
    CHECK(strstr(at_last_error(), "evaluation/no_such_benchmark") != NULL);
    CHECK_FAILS(at_mc_bench_load(DATA "/bad/unmapped", "val", 0, &b), AT_ERR_NOT_FOUND);
    CHECK_MSG(strstr(at_last_error(), "mystery_val.csv: subject 'mystery' is not in") != NULL, "%s", at_last_error());
    CHECK_FAILS(at_mc_bench_load(DATA "/bad/nodev", "val", 1, &b), AT_ERR_NOT_FOUND);
    CHECK_MSG(strstr(at_last_error(), "dev/solo_dev.csv: no such file") != NULL, "%s", at_last_error());
    CHECK_FAILS(at_mc_bench_load(DATA "/mmlu", "test", 0, &b), AT_ERR_NOT_FOUND);
    CHECK(strstr(at_last_error(), "mmlu/test: no such folder") != NULL);
    CHECK_FAILS(at_mc_bench_load(DATA, "val", 0, &b), AT_ERR_NOT_FOUND); /* no val/ here */
    /* without mapping.json: subjects by file name, no category */
    CHECK_OK(at_mc_bench_load(DATA "/bad/nodev", "val", 0, &b));
    CHECK(b.n == 1 && !strcmp(b.subjects[0].name, "solo") && b.subjects[0].category == NULL);
    at_mc_bench_free(&b);
}

/* ---- prompts, ids and logits against torch ---- */

static at_mc_subject *find_subject(at_mc_bench *b, const char *id)
{
    for (size_t i = 0; i < b->n; i++)
        if (!strcmp(b->subjects[i].id, id)) return &b->subjects[i];
    return NULL;
}

static void test_prompts(at_bundle *bd)
{
    int32_t choice[4];
    CHECK_OK(at_mc_choice_ids(bd->tokenizer, choice));
    CHECK(ids_equal(choice, 4, cJSON_GetObjectItem(golden, "choice_ids")));
    at_mc_bench benches[2];
    CHECK_OK(at_mc_bench_load(DATA "/mmlu", "val", 1, &benches[0]));
    CHECK_OK(at_mc_bench_load(DATA "/ceval", "val", 1, &benches[1]));
    const cJSON *c;
    int n_logits = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(golden, "mc")) {
        at_mc_bench *bench = &benches[strcmp(str(c, "bench"), "ceval") == 0];
        at_mc_subject *s = find_subject(bench, str(c, "subject"));
        CHECK(s != NULL);
        if (!s) continue;
        at_mc_options o = {0};
        CHECK_OK(at_mc_lang_parse(str(c, "lang"), &o.lang));
        o.n_shot = (int)num(c, "n_shot");
        size_t q = (size_t)num(c, "question");
        int32_t *ids = NULL;
        size_t n = 0;
        int shots = -1;
        char *text = NULL;
        CHECK_OK(at_mc_encode(bd, s, q, &o, 0, &ids, &n, &shots, &text));
        CHECK(shots == o.n_shot);
        CHECK_MSG(text && !strcmp(text, str(c, "prompt")), "%s #%zu: prompt differs:\n%s\n--- want ---\n%s", s->id, q,
                  text ? text : "(null)", str(c, "prompt"));
        CHECK_MSG(ids_equal(ids, n, cJSON_GetObjectItem(c, "ids")), "%s #%zu: token ids differ", s->id, q);
        free(ids);
        free(text);
        const cJSON *want = cJSON_GetObjectItem(c, "choice_logits");
        if (!want) continue;
        /* through the batched evaluator: this question with the ones before it */
        at_mc_bench one = {0};
        one.subjects = s;
        one.n = 1;
        o.limit = (int)q + 1;
        o.batch_size = 3;
        at_mc_result r;
        CHECK_OK(at_mc_evaluate(bd, &one, &o, &r));
        if (r.n == 1 && r.subjects[0].n == q + 1) {
            const at_mc_pred *p = &r.subjects[0].preds[q];
            float w[4];
            for (int k = 0; k < 4; k++) w[k] = (float)cJSON_GetArrayItem(want, k)->valuedouble;
            double err = at_test_max_rel_err(p->logits, w, 4, 1.0);
            CHECK_MSG(err < 1e-4, "%s #%zu: choice logits differ from torch by %g relative", s->id, q, err);
            CHECK(p->pred >= 0 && 'A' + p->pred == str(c, "pred")[0]);
            CHECK(p->shots == o.n_shot);
            n_logits++;
        }
        at_mc_result_free(&r);
    }
    CHECK(n_logits == 5);
    at_mc_bench_free(&benches[0]);
    at_mc_bench_free(&benches[1]);
}

/* ---- accuracy over four MMLU subjects ---- */

static void test_accuracy(at_bundle *bd)
{
    const cJSON *acc = cJSON_GetObjectItem(golden, "accuracy");
    at_mc_bench bench;
    CHECK_OK(at_mc_bench_load(DATA "/mmlu", "val", 1, &bench));
    CHECK(bench.n == 4);
    at_mc_options o = {0};
    o.lang = AT_MC_EN;
    o.n_shot = (int)num(golden, "n_shot");
    o.max_length = (int)num(golden, "max_length");
    o.batch_size = 4;
    at_mc_result r;
    CHECK_OK(at_mc_evaluate(bd, &bench, &o, &r));
    cJSON *j = r.n == bench.n ? at_mc_result_json(&bench, &r) : NULL;
    CHECK(j != NULL);
    /* the golden's smallest margin between the two best choices is far above the tolerance */
    CHECK(num(acc, "min_logit_gap") > 1e-2);
    const cJSON *ws;
    cJSON_ArrayForEach(ws, cJSON_GetObjectItem(acc, "subjects")) {
        const cJSON *got = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "subjects"), ws->string);
        CHECK_MSG(got && !strcmp(str(got, "predictions"), str(ws, "predictions")), "%s: predictions %s, torch %s",
                  ws->string, got ? str(got, "predictions") : "?", str(ws, "predictions"));
        CHECK(num(got, "correct") == num(ws, "correct") && num(got, "total") == num(ws, "total"));
        at_mc_subject *s = find_subject(&bench, ws->string);
        size_t si = s ? (size_t)(s - bench.subjects) : 0;
        const cJSON *sh = cJSON_GetObjectItem(ws, "shots");
        for (size_t q = 0; s && q < r.subjects[si].n; q++)
            CHECK(r.subjects[si].preds[q].shots == (int)cJSON_GetArrayItem(sh, (int)q)->valuedouble);
    }
    const cJSON *wc;
    cJSON_ArrayForEach(wc, cJSON_GetObjectItem(acc, "categories")) {
        const cJSON *got = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "categories"), wc->string);
        CHECK_MSG(got && num(got, "correct") == num(wc, "correct") && num(got, "total") == num(wc, "total"),
                  "category %s", wc->string);
    }
    const cJSON *avg = cJSON_GetObjectItem(j, "average"), *wa = cJSON_GetObjectItem(acc, "average");
    CHECK(num(avg, "correct") == num(wa, "correct") && num(avg, "total") == num(wa, "total"));
    CHECK_NEAR(num(avg, "accuracy"), num(wa, "accuracy"), 1e-12);
    CHECK(r.skipped == 3); /* three questions too long for 400 tokens even alone */
    char *text = at_mc_result_text(&bench, &r);
    CHECK(text && strstr(text, "Average:") && strstr(text, "STEM:"));
    free(text);
    cJSON_Delete(j);
    at_mc_result_free(&r);
    at_mc_bench_free(&bench);
}

/* ---- loss and perplexity ---- */

static void test_loss(at_bundle *bd, const char *file, int pt, const char *key)
{
    const cJSON *w = cJSON_GetObjectItem(cJSON_GetObjectItem(golden, "loss"), key);
    at_loss_eval_options o = {0};
    o.pt = pt;
    o.batch_size = 2;
    o.truncation = AT_TRUNCATE_DELETE;
    o.strict = 1;
    const char *specs[1] = {file};
    at_encoded *e = NULL;
    size_t n = 0;
    at_loss_eval_result r = {0};
    CHECK_OK(at_loss_eval_encode(bd, specs, 1, &o, &e, &n, &r));
    const cJSON *wids = cJSON_GetObjectItem(w, "ids"), *wlab = cJSON_GetObjectItem(w, "labels");
    CHECK(n == (size_t)cJSON_GetArraySize(wids));
    /* labels from the chat template's assistant spans, token by token as
     * Python finds them (a dummy-prefix space after a special token covers
     * no byte of the text, so the spans do not drift) */
    for (size_t i = 0; i < n && i < (size_t)cJSON_GetArraySize(wids); i++) {
        CHECK_MSG(ids_equal(e[i].ids, e[i].n, cJSON_GetArrayItem(wids, (int)i)), "%s sample %zu: ids differ", key, i);
        const cJSON *wl = cJSON_GetArrayItem(wlab, (int)i);
        CHECK(wl && (size_t)cJSON_GetArraySize(wl) == e[i].n);
        for (size_t t = 0; wl && t < e[i].n && t < (size_t)cJSON_GetArraySize(wl); t++) {
            int want = (int)cJSON_GetArrayItem(wl, (int)t)->valuedouble;
            CHECK_MSG(e[i].labels[t] == want, "%s sample %zu token %zu: label %d, Python %d", key, i, t,
                      e[i].labels[t], want);
        }
    }
    CHECK_OK(at_loss_eval_encoded(bd->decoder, e, n, o.batch_size, &r));
    CHECK(r.n_targets == (int64_t)num(w, "n_targets"));
    CHECK_MSG(fabs(r.loss - num(w, "loss")) <= 1e-4 * num(w, "loss"), "%s: loss %.7f, torch %.7f", key, r.loss,
              num(w, "loss"));
    CHECK_MSG(fabs(r.perplexity - num(w, "perplexity")) <= 2e-4 * num(w, "perplexity"), "%s: perplexity %.6f, "
              "torch %.6f", key, r.perplexity, num(w, "perplexity"));
    for (size_t i = 0; i < n; i++) at_encoded_free(&e[i]);
    free(e);
    /* the whole path, one row at a time: the same numbers */
    o.batch_size = 1;
    CHECK_OK(at_loss_eval_run(bd, specs, 1, &o, &r));
    CHECK(r.n_samples == n && fabs(r.loss - num(w, "loss")) <= 1e-4 * num(w, "loss"));
}

/* ---- the command line ---- */

static cJSON *read_json(const char *path)
{
    cJSON *j = NULL;
    if (at_json_parse_file(path, &j) != AT_OK) {
        fprintf(stderr, "%s\n", at_last_error());
        return NULL;
    }
    return j;
}

static void test_cli(void)
{
    const char *bin = getenv("ANYTUNE_BIN");
    if (!bin) {
        printf("cli: ANYTUNE_BIN not set (run through ctest): skipped\n");
        return;
    }
    char cmd[2048], path[256];
    snprintf(cmd, sizeof cmd, "%s eval --model " MODEL " --eval_dataset " DATA "/mmlu --eval_limit 3 --n_shot 1 "
             "--eval_batch_size 2 --eval_output_dir %s/out >/dev/null 2>&1", bin, tmp_root);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/out/mmlu_val_results.json", tmp_root);
    cJSON *j = read_json(path);
    CHECK(j != NULL);
    if (j) {
        CHECK(!strcmp(str(j, "task"), "multiple_choice") && !strcmp(str(j, "split"), "val"));
        CHECK(num(j, "n_shot") == 1 && !strcmp(str(j, "lang"), "en") && num(j, "max_length") == 512);
        const cJSON *subs = cJSON_GetObjectItem(j, "subjects"), *s;
        CHECK(cJSON_GetArraySize(subs) == 4);
        double total = 0, correct = 0;
        cJSON_ArrayForEach(s, subs) {
            CHECK(strlen(str(s, "predictions")) == 3);
            total += num(s, "total");
            correct += num(s, "correct");
        }
        const cJSON *avg = cJSON_GetObjectItem(j, "average");
        CHECK(num(avg, "total") == total && num(avg, "correct") == correct && total > 0);
        CHECK_NEAR(num(avg, "accuracy"), correct / total, 1e-12);
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "categories"), "STEM") != NULL);
        const cJSON *args = cJSON_GetObjectItem(j, "args");
        CHECK(num(args, "eval_limit") == 3 && !strcmp(str(args, "eval_dataset"), DATA "/mmlu"));
        cJSON_Delete(j);
    }
    /* perplexity, --pt */
    snprintf(cmd, sizeof cmd, "%s eval --model " MODEL " --dataset " DATA "/texts.jsonl --pt --eval_output_dir %s/out "
             ">/dev/null 2>&1", bin, tmp_root);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/out/loss_results.json", tmp_root);
    j = read_json(path);
    CHECK(j != NULL);
    if (j) {
        const cJSON *w = cJSON_GetObjectItem(cJSON_GetObjectItem(golden, "loss"), "pt");
        CHECK(fabs(num(j, "eval_loss") - num(w, "loss")) <= 1e-4 * num(w, "loss"));
        CHECK(fabs(num(j, "perplexity") - exp(num(j, "eval_loss"))) <= 1e-9 * num(j, "perplexity"));
        CHECK(num(j, "tokens") == num(w, "n_targets") && num(j, "samples") == 3);
        cJSON_Delete(j);
    }
    /* with an adapter: a LoRA run evaluating the same data at its end logs
     * the eval_loss that `anytune eval --adapters` computes from its checkpoint
     * (f32 frozen weights on both sides: for training the planner would pick
     * bf16 on this CPU, eval keeps the stored f32) */
    snprintf(cmd, sizeof cmd, "%s sft --model " MODEL " --dataset demo/identity.json --val_dataset demo/identity.json "
             "--model_name anytune --model_author 'the anytune team' --max_steps 4 --save_steps 4 --eval_steps 4 --torch_dtype float32 "
             "--learning_rate 3e-3 --output_dir %s/sft >/dev/null 2>&1 && cp \"$(ls -d %s/sft/v*/checkpoint-4)/../logging.jsonl\" %s/sft.jsonl && "
             "%s eval --model " MODEL " --adapters \"$(ls -d %s/sft/v*/checkpoint-4)\" --dataset demo/identity.json "
             "--model_name anytune --model_author 'the anytune team' --eval_output_dir %s/ad >/dev/null 2>&1 && "
             "%s eval --model " MODEL " --dataset demo/identity.json --model_name anytune --model_author "
             "'the anytune team' --eval_output_dir %s/base >/dev/null 2>&1",
             bin, tmp_root, tmp_root, tmp_root, bin, tmp_root, tmp_root, bin, tmp_root);
    CHECK(system(cmd) == 0);
    double trainer_eval = NAN;
    snprintf(path, sizeof path, "%s/sft.jsonl", tmp_root);
    char *log = NULL;
    if (at_read_file(path, &log, NULL) == AT_OK) {
        for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
            cJSON *l = cJSON_Parse(line);
            const cJSON *e = cJSON_GetObjectItem(l, "eval_loss");
            if (cJSON_IsNumber(e)) trainer_eval = e->valuedouble;
            cJSON_Delete(l);
        }
    }
    free(log);
    snprintf(path, sizeof path, "%s/ad/loss_results.json", tmp_root);
    cJSON *ad = read_json(path);
    snprintf(path, sizeof path, "%s/base/loss_results.json", tmp_root);
    cJSON *base = read_json(path);
    if (ad && base) {
        double ev = num(ad, "eval_loss"), ev0 = num(base, "eval_loss");
        printf("adapter: trainer's eval_loss %.7f, anytune eval --adapters %.7f, base model %.7f\n", trainer_eval, ev,
               ev0);
        CHECK_MSG(fabs(ev - trainer_eval) <= 1e-5 * trainer_eval, "eval --adapters %.7f vs the trainer's %.7f", ev,
                  trainer_eval);
        CHECK(ev < 0.9 * ev0); /* the adapter is applied */
    } else {
        CHECK_MSG(0, "no loss_results.json from the adapter / base runs");
    }
    cJSON_Delete(ad);
    cJSON_Delete(base);

    /* errors: usage (2) and bad data (1, with the file and line) */
    snprintf(cmd, sizeof cmd, "%s eval --model " MODEL " >/dev/null 2>&1", bin);
    CHECK(WEXITSTATUS(system(cmd)) == 2);
    snprintf(cmd, sizeof cmd, "%s eval --model " MODEL " --eval_dataset " DATA "/bad/unmapped --n_shot 0 "
             "--eval_output_dir %s/out 2>%s/err.txt >/dev/null", bin, tmp_root, tmp_root);
    CHECK(WEXITSTATUS(system(cmd)) == 1);
    snprintf(path, sizeof path, "%s/err.txt", tmp_root);
    char *err = NULL;
    size_t len = 0;
    CHECK_OK(at_read_file(path, &err, &len));
    CHECK_MSG(err && strstr(err, "mystery_val.csv: subject 'mystery' is not in"), "%s", err ? err : "");
    free(err);
}

int main(void)
{
    at_log_set_level(AT_LOG_ERROR);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/at_eval_XXXXXX");
    if (!mkdtemp(tmp_root)) {
        fprintf(stderr, "cannot create a temporary folder\n");
        return 1;
    }
    if (at_json_parse_file(DATA "/goldens.json", &golden) != AT_OK) {
        fprintf(stderr, "%s\n", at_last_error());
        return 1;
    }
    test_csv_counts();
    test_errors();
    at_bundle *bd = NULL;
    at_bundle_opts bo = {0};
    bo.model = MODEL;
    bo.dtype = AT_LOAD_KEEP_DTYPE;
    CHECK_OK(at_bundle_load(&bo, &bd));
    if (bd) {
        test_prompts(bd);
        test_accuracy(bd);
        test_loss(bd, DATA "/texts.jsonl", 1, "pt");
        test_loss(bd, DATA "/chat.jsonl", 0, "chat");
    }
    at_bundle_free(bd);
    test_cli();
    cJSON_Delete(golden);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_root);
    return at_test_result("test_eval");
}
