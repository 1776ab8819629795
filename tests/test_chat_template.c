/* Chat templates against Jinja2: tests/data/templates/goldens.json holds, for
 * real templates (and the built-in fallbacks) x conversations x
 * add_generation_prompt, the text Debian's python3-jinja2 rendered (configured
 * as transformers configures it) or the error it raised, and the assistant
 * spans the prefix rule finds on that text (tools/make_template_goldens.py).
 * Ours must be byte-identical, fail where Jinja2 failed (with the template's
 * own message for raise_exception), and give the same spans. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "testing.h"
#include "text/chat_template.h"

#define DATA "tests/data/templates/"

static at_jinja_options fixed_opts(void)
{
    at_jinja_options o = {0};
    o.has_fixed_time = 1;
    o.fixed_time = 1721989800;
    return o;
}

/* Loads the template a golden entry describes, the way a user would. */
static at_status load_golden_template(const cJSON *t, at_chat_template **ct)
{
    const cJSON *file = cJSON_GetObjectItem(t, "file"), *config = cJSON_GetObjectItem(t, "config");
    const cJSON *tokens = cJSON_GetObjectItem(t, "tokens");
    char path[512];
    if (config) {
        snprintf(path, sizeof path, DATA "%s/tokenizer_config.json", config->valuestring);
        return at_chat_template_from_config(path, NULL, ct);
    }
    const char *f = file->valuestring;
    if (!strncmp(f, "builtin/", 8)) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(strlen(f) - 8 - 6), f + 8); /* builtin/NAME.jinja */
        return at_chat_template_builtin(name, NULL, ct);
    }
    if (!strcmp(f, "smollm3/chat_template.jinja")) return at_chat_template_load(DATA "smollm3", NULL, NULL, ct);
    snprintf(path, sizeof path, DATA "%s", f);
    char *src = NULL;
    size_t len = 0;
    at_status st = at_read_file(path, &src, &len);
    if (st == AT_OK) st = at_chat_template_from_string(src, len, f, tokens, ct);
    free(src);
    return st;
}

/* The special tokens we loaded must be the ones the goldens were made with. */
static int same_tokens(const at_chat_template *ct, const cJSON *tokens)
{
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *want = cJSON_GetObjectItem(tokens, keys[i]);
        const char *got = at_chat_template_token(ct, keys[i]);
        if (!want != !got) return 0;
        if (want && strcmp(want->valuestring, got) != 0) return 0;
    }
    return 1;
}

static int spans_equal(const at_chat_rendered *r, const cJSON *want)
{
    if ((size_t)cJSON_GetArraySize(want) != r->n_spans) return 0;
    size_t i = 0;
    for (const cJSON *s = want->child; s; s = s->next, i++)
        if ((size_t)cJSON_GetArrayItem(s, 0)->valuedouble != r->spans[i].start ||
            (size_t)cJSON_GetArrayItem(s, 1)->valuedouble != r->spans[i].end)
            return 0;
    return 1;
}

/* What a span must look like, independently of the rule that found it: the
 * turn's end token inside, nothing after the last one but whitespace and the
 * eos token, and no role-header scaffolding. */
static int span_looks_right(const char *text, const at_chat_span *sp, const char *turn_end, const char *eos)
{
    size_t n = sp->end - sp->start;
    char *s = malloc(n + 1);
    if (!s) return 0;
    memcpy(s, text + sp->start, n);
    s[n] = '\0';
    int ok = 1;
    char *last = NULL, *p = s;
    while ((p = strstr(p, turn_end)) != NULL) last = p++;
    if (!last) ok = 0;
    if (ok) {
        const char *rest = last + strlen(turn_end);
        while (*rest == '\n' || *rest == ' ') rest++;
        if (*rest && !(eos && strcmp(rest, eos) == 0)) ok = 0;
    }
    static const char *const headers[] = {"<|im_start|>", "<|start_header_id|>", "<start_of_turn>", "[INST]",
                                          "<|assistant|>", "<｜Assistant｜>", "<|user|>"};
    for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++)
        if (strstr(s, headers[i])) ok = 0;
    free(s);
    return ok;
}

static void test_goldens(void)
{
    cJSON *g = NULL;
    CHECK_OK(at_json_parse_file(DATA "goldens.json", &g));
    if (!g) return;
    const cJSON *convs = cJSON_GetObjectItem(g, "conversations");
    at_jinja_options jo = fixed_opts();
    int n_cases = 0, n_pass = 0, n_templates = 0, n_span_cases = 0, n_span_pass = 0, n_err = 0;
    for (const cJSON *t = cJSON_GetObjectItem(g, "templates")->child; t; t = t->next) {
        const char *tname = cJSON_GetObjectItem(t, "name")->valuestring;
        const char *turn_end = cJSON_GetObjectItem(t, "turn_end")->valuestring;
        at_chat_template *ct = NULL;
        at_status ls = load_golden_template(t, &ct);
        CHECK_MSG(ls == AT_OK, "%s: %s", tname, at_last_error());
        if (!ct) continue;
        n_templates++;
        CHECK_MSG(same_tokens(ct, cJSON_GetObjectItem(t, "tokens")), "%s: special tokens differ", tname);
        const char *eos = at_chat_template_token(ct, "eos_token");
        const cJSON *exempt = cJSON_GetObjectItem(t, "span_check_exempt");
        if (exempt) printf("  note: %s: spans not checked for scaffolding: %s\n", tname, exempt->valuestring);
        int tpass = 0, tn = 0;
        for (const cJSON *c = cJSON_GetObjectItem(t, "cases")->child; c; c = c->next) {
            const char *cname = cJSON_GetObjectItem(c, "conversation")->valuestring;
            const cJSON *conv = cJSON_GetObjectItem(convs, cname);
            at_chat_render_opts o = {0};
            o.tools = cJSON_IsArray(cJSON_GetObjectItem(conv, "tools")) ? cJSON_GetObjectItem(conv, "tools") : NULL;
            o.extra = cJSON_GetObjectItem(conv, "extra");
            o.add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
            o.jinja = &jo;
            const cJSON *msgs = cJSON_GetObjectItem(conv, "messages");
            const cJSON *want = cJSON_GetObjectItem(c, "output");
            at_chat_rendered r;
            at_status st = at_chat_template_render(ct, msgs, &o, &r);
            int ok;
            n_cases++;
            tn++;
            if (want) {
                ok = st == AT_OK && r.len == strlen(want->valuestring) && memcmp(r.text, want->valuestring, r.len) == 0;
                if (!ok) {
                    fprintf(stderr, "%s / %s / agp=%d: ", tname, cname, o.add_generation_prompt);
                    if (st != AT_OK) {
                        fprintf(stderr, "failed: %s\n", at_last_error());
                    } else {
                        size_t i = 0;
                        while (want->valuestring[i] && want->valuestring[i] == r.text[i]) i++;
                        fprintf(stderr, "differs at byte %zu:\n  want: %.60s\n  got:  %.60s\n", i,
                                want->valuestring + i, r.text + i);
                    }
                }
            } else {
                n_err++;
                const char *kind = cJSON_GetObjectItem(c, "error_kind")->valuestring;
                const char *msg = cJSON_GetObjectItem(c, "error")->valuestring;
                ok = st == AT_ERR_INVALID && (strcmp(kind, "raise") != 0 || strstr(at_last_error(), msg) != NULL);
                if (!ok)
                    fprintf(stderr, "%s / %s / agp=%d: expected %s error '%s', got %d: %s\n", tname, cname,
                            o.add_generation_prompt, kind, msg, st, st ? at_last_error() : "(rendered)");
            }
            CHECK(ok);
            n_pass += ok;
            tpass += ok;
            at_chat_rendered_free(&r);
            /* loss-mask spans */
            static const char *const keys[] = {"spans_all", "spans_last"};
            for (int k = 0; k < 2 && want; k++) {
                const cJSON *ws = cJSON_GetObjectItem(c, keys[k]);
                char ekey[32];
                snprintf(ekey, sizeof ekey, "%s_error", keys[k]);
                const cJSON *we = cJSON_GetObjectItem(c, ekey);
                if (!ws && !we) continue;
                o.mask = k == 0 ? AT_CHAT_MASK_ALL : AT_CHAT_MASK_LAST;
                st = at_chat_template_render(ct, msgs, &o, &r);
                n_span_cases++;
                int sok;
                if (ws) {
                    sok = st == AT_OK && spans_equal(&r, ws);
                    for (size_t i = 0; sok && !exempt && i < r.n_spans; i++)
                        sok = span_looks_right(r.text, &r.spans[i], turn_end, eos);
                } else {
                    sok = st == AT_ERR_UNSUPPORTED;
                }
                if (!sok) fprintf(stderr, "%s / %s: %s differ (%s)\n", tname, cname, keys[k], st ? at_last_error() : "");
                CHECK(sok);
                n_span_pass += sok;
                at_chat_rendered_free(&r);
                o.mask = AT_CHAT_MASK_NONE;
            }
        }
        printf("  %-48s %d/%d\n", tname, tpass, tn);
        at_chat_template_free(ct);
    }
    printf("chat template goldens: %d templates, %d/%d renders match Jinja2 (%d of them expected errors), "
           "%d/%d loss-mask span sets match\n",
           n_templates, n_pass, n_cases, n_err, n_span_pass, n_span_cases);
    CHECK(n_templates >= 19 && n_cases >= 400 && n_span_cases >= 200);
    cJSON_Delete(g);
}

/* The built-in templates are the files the goldens were made from. */
static void test_builtin_sources(void)
{
    static const char *const names[] = {"chatml", "llama-2", "llama-3", "mistral", "qwen",
                                        "qwen2_5", "internlm2", "llama", "llama3_2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[256], *src = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, DATA "builtin/%s.jinja", names[i]);
        CHECK_OK(at_read_file(path, &src, &len));
        const char *b = at_chat_template_builtin_source(names[i]);
        CHECK_MSG(src && b && strlen(b) == len && memcmp(b, src, len) == 0, "builtin %s differs from %s", names[i], path);
        free(src);
    }
    CHECK(at_chat_template_builtin_source("nope") == NULL);
    at_chat_template *ct = NULL;
    CHECK_FAILS(at_chat_template_builtin("nope", NULL, &ct), AT_ERR_NOT_FOUND);
}

/* The golden case (Jinja2's text) of template `file`, conversation `conv`,
 * add_generation_prompt `agp`, or NULL. */
static const char *golden_output(const cJSON *g, const char *file, const char *conv, int agp)
{
    for (const cJSON *t = cJSON_GetObjectItem(g, "templates")->child; t; t = t->next) {
        const cJSON *f = cJSON_GetObjectItem(t, "file");
        if (!cJSON_IsString(f) || strcmp(f->valuestring, file) != 0) continue;
        for (const cJSON *c = cJSON_GetObjectItem(t, "cases")->child; c; c = c->next)
            if (!strcmp(cJSON_GetObjectItem(c, "conversation")->valuestring, conv) &&
                cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")) == agp)
                return cJSON_GetStringValue(cJSON_GetObjectItem(c, "output"));
    }
    return NULL;
}

/* ms-swift's template names render what the model's own template renders
 * (issue 21): qwen2_5 adds Qwen2.5's default system message ("You are
 * Qwen, created by Alibaba Cloud...") as Qwen2.5-7B-Instruct's template and
 * ms-swift's Qwen2_5TemplateMeta do, and llama3_2 opens with Llama 3.2's
 * knowledge-cutoff and date system turn. Compared in Jinja2's goldens (ours
 * equal them in test_goldens) on every conversation without tools. */
static void test_swift_names_match_model_templates(void)
{
    static const char *const pairs[][2] = {{"builtin/qwen2_5.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja"},
                                           {"builtin/llama3_2.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja"}};
    cJSON *g = NULL;
    CHECK_OK(at_json_parse_file(DATA "goldens.json", &g));
    if (!g) return;
    int compared = 0;
    for (size_t p = 0; p < 2; p++)
        for (const cJSON *cv = cJSON_GetObjectItem(g, "conversations")->child; cv; cv = cv->next) {
            if (cJSON_IsArray(cJSON_GetObjectItem(cv, "tools"))) continue;
            for (int agp = 0; agp < 2; agp++) {
                const char *ours = golden_output(g, pairs[p][0], cv->string, agp);
                const char *theirs = golden_output(g, pairs[p][1], cv->string, agp);
                if (!theirs) continue; /* the model's template refused it (roles not alternating...) */
                CHECK_MSG(ours && !strcmp(ours, theirs), "%s vs %s on %s: '%s' != '%s'", pairs[p][0], pairs[p][1],
                          cv->string, ours ? ours : "(error)", theirs);
                compared++;
            }
        }
    CHECK_MSG(compared >= 20, "only %d cases compared", compared);
    /* and the names select them */
    at_chat_template *ct = NULL;
    CHECK_OK(at_chat_template_builtin("qwen2_5", NULL, &ct));
    CHECK(ct && strstr(at_chat_template_source(ct), "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."));
    at_chat_template_free(ct);
    CHECK(!strcmp(at_chat_template_builtin_name("qwen2"), "qwen"));
    CHECK(!strcmp(at_chat_template_builtin_name("llama2"), "llama"));
    CHECK(!strcmp(at_chat_template_builtin_name("yi"), "chatml"));
    cJSON_Delete(g);
}

/* The config copies whose templates equal a .jinja file load to that text. */
static void test_config_equals_file(void)
{
    static const char *const pairs[][2] = {{"qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja"},
                                           {"qwen3-full", "Qwen-Qwen3-0.6B.jinja"}};
    for (size_t i = 0; i < 2; i++) {
        char cfg[256], file[256], *src = NULL;
        size_t len = 0;
        snprintf(cfg, sizeof cfg, DATA "configs/%s/tokenizer_config.json", pairs[i][0]);
        snprintf(file, sizeof file, DATA "%s", pairs[i][1]);
        at_chat_template *ct = NULL;
        CHECK_OK(at_chat_template_from_config(cfg, NULL, &ct));
        CHECK_OK(at_read_file(file, &src, &len));
        CHECK(ct && src && strcmp(at_chat_template_source(ct), src) == 0);
        CHECK(ct && strcmp(at_chat_template_token(ct, "eos_token"), "<|im_end|>") == 0);
        CHECK(ct && at_chat_template_token(ct, "bos_token") == NULL);
        free(src);
        at_chat_template_free(ct);
    }
}

static at_status write_text(const char *path, const char *s) { return at_write_file_atomic(path, s, strlen(s)); }

static void test_named_templates_and_fallbacks(void)
{
    char dir[] = "/tmp/at_chat_tmpl_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    char *cfg = at_path_join(dir, "tokenizer_config.json");
    /* a list of named templates; tokens as AddedToken objects */
    CHECK_OK(write_text(cfg, "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<B>\", \"lstrip\": false},"
                             " \"eos_token\": \"<E>\", \"chat_template\": ["
                             "{\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ messages|length }}\"},"
                             "{\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}{{ eos_token }}\"}]}"));
    at_chat_template *ct = NULL;
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]");
    at_chat_rendered r;
    at_chat_render_opts o = {0};
    CHECK_OK(at_chat_template_from_config(cfg, NULL, &ct));
    CHECK_OK(at_chat_template_render(ct, msgs, &o, &r));
    CHECK(r.text && strcmp(r.text, "D<B>1") == 0);
    at_chat_rendered_free(&r);
    at_chat_template_free(ct);
    CHECK_OK(at_chat_template_from_config(cfg, "tool_use", &ct));
    o.tools = tools;
    CHECK_OK(at_chat_template_render(ct, msgs, &o, &r));
    CHECK(r.text && strcmp(r.text, "T1<E>") == 0);
    at_chat_rendered_free(&r);
    at_chat_template_free(ct);
    CHECK_FAILS(at_chat_template_from_config(cfg, "rag", &ct), AT_ERR_NOT_FOUND);
    /* folder loading: the config's default template */
    CHECK_OK(at_chat_template_load(dir, NULL, NULL, &ct));
    CHECK(ct && strcmp(at_chat_template_source(ct), "D{{ bos_token }}{{ messages|length }}") == 0);
    at_chat_template_free(ct);
    /* a config without a template: the fallback, with the config's tokens */
    CHECK_OK(at_chat_template_load(DATA "configs/llama2", NULL, "llama-2", &ct));
    o.tools = NULL;
    cJSON *two = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]");
    CHECK_OK(at_chat_template_render(ct, two, &o, &r));
    CHECK_MSG(r.text && strcmp(r.text, "<s>[INST] hi [/INST] yo </s>") == 0, "got %s", r.text ? r.text : "");
    at_chat_rendered_free(&r);
    at_chat_template_free(ct);
    CHECK_FAILS(at_chat_template_load(DATA "configs/llama2", NULL, NULL, &ct), AT_ERR_NOT_FOUND);
    CHECK_FAILS(at_chat_template_load(DATA "configs/llama2", NULL, "no-such-builtin", &ct), AT_ERR_NOT_FOUND);
    CHECK(ct == NULL);
    /* a broken template names its line and column */
    CHECK_OK(write_text(cfg, "{\"chat_template\": \"{% for m in messages %}\\n{{ m.role + }}{% endfor %}\"}"));
    CHECK_FAILS(at_chat_template_load(dir, NULL, NULL, &ct), AT_ERR_FORMAT);
    CHECK_MSG(strstr(at_last_error(), ":2:") != NULL, "got %s", at_last_error());
    /* bad inputs */
    CHECK_OK(at_chat_template_builtin("chatml", NULL, &ct));
    cJSON *notarr = cJSON_Parse("{\"role\": \"user\"}"), *norole = cJSON_Parse("[{\"content\": \"x\"}]");
    CHECK_FAILS(at_chat_template_render(ct, notarr, &o, &r), AT_ERR_INVALID);
    CHECK_FAILS(at_chat_template_render(ct, norole, &o, &r), AT_ERR_INVALID);
    CHECK(r.text == NULL);
    at_chat_template_free(ct);
    cJSON_Delete(notarr);
    cJSON_Delete(norole);
    cJSON_Delete(two);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    remove(cfg);
    rmdir(dir);
    free(cfg);
}

/* A template that changes earlier text depending on later messages cannot be
 * masked by prefixes: the error says so instead of returning wrong spans. */
static void test_unmaskable(void)
{
    const char *src = "{% for m in messages %}{{ m.role }}{{ messages|length }}:{{ m.content }};{% endfor %}";
    at_chat_template *ct = NULL;
    CHECK_OK(at_chat_template_from_string(src, strlen(src), "counting", NULL, &ct));
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]");
    at_chat_render_opts o = {0};
    o.mask = AT_CHAT_MASK_ALL;
    at_chat_rendered r;
    CHECK_FAILS(at_chat_template_render(ct, msgs, &o, &r), AT_ERR_UNSUPPORTED);
    CHECK(strstr(at_last_error(), "message 1") != NULL);
    cJSON_Delete(msgs);
    at_chat_template_free(ct);
}

int main(void)
{
    test_goldens();
    test_builtin_sources();
    test_swift_names_match_model_templates();
    test_config_equals_file();
    test_named_templates_and_fallbacks();
    test_unmaskable();
    return at_test_result("test_chat_template");
}
