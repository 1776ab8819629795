/* Loaders other than tokenizer.json: vocab.json + merges.txt (and the same
 * pair named encoder.json + vocab.bpe), llama2.c's tokenizer.bin, plain
 * arrays (GGUF's tokenizer.ggml.*), and tokenizer_config.json.
 *
 * vocab.json + merges.txt say nothing about the pre-tokenizer and the
 * normalizer; they are chosen by family, as llama.cpp's tokenizer.ggml.pre:
 * from the caller, else tokenizer_config.json's tokenizer_class, else the
 * vocabulary itself. The choice is logged and at_tokenizer_pre_name tells it. */
#include "text/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"

at_status tok_load_vocab_merges(const char *dir, const at_tokenizer_opts *opts, at_tokenizer **out);
at_status tok_load_llama2c(const char *path, at_tokenizer **out);

static at_status pre_regex(at_tokenizer *t, const char *re)
{
    tok_pre p = {.kind = TOK_PRE_SPLIT, .behavior = TOK_SPLIT_ISOLATED};
    AT_TRY(tok_regex_compile(re, strlen(re), &p.re, "tokenizer family"));
    return tok_push_pre(t, &p);
}

static at_status pre_byte_level(at_tokenizer *t, int use_regex)
{
    tok_pre p = {.kind = TOK_PRE_BYTELEVEL, .use_regex = use_regex};
    if (use_regex) AT_TRY(tok_regex_compile(tok_re_gpt2, strlen(tok_re_gpt2), &p.re, "tokenizer family"));
    return tok_push_pre(t, &p);
}

/* The pipelines of the families, as their tokenizer.json files define them. */
at_status tok_use_family(at_tokenizer *t, const char *name)
{
    const char *canon;
    if (!strcmp(name, "gpt2") || !strcmp(name, "gpt-2") || !strcmp(name, "default")) {
        canon = "gpt2";
        AT_TRY(pre_byte_level(t, 1));
    } else if (!strcmp(name, "llama3") || !strcmp(name, "llama-bpe") || !strcmp(name, "llama-3")) {
        canon = "llama3";
        /* Llama 3's tokenizer.json sets ignore_merges: a pre-token that is a
         * token is emitted whole (" Việt" differs without it). */
        t->model.ignore_merges = 1;
        AT_TRY(pre_regex(t, tok_re_llama3));
        AT_TRY(pre_byte_level(t, 0));
    } else if (!strcmp(name, "qwen2") || !strcmp(name, "qwen") || !strcmp(name, "qwen3") ||
               !strcmp(name, "deepseek-r1-qwen")) {
        canon = "qwen2";
        AT_TRY(tok_push_norm(t, &(tok_norm){.kind = TOK_NORM_NFC}));
        AT_TRY(pre_regex(t, tok_re_qwen2));
        AT_TRY(pre_byte_level(t, 0));
    } else if (!strcmp(name, "smollm")) {
        /* SmolLM: single digits, then GPT-2's byte-level split. */
        canon = "smollm";
        AT_TRY(tok_push_pre(t, &(tok_pre){.kind = TOK_PRE_DIGITS, .individual = 1}));
        AT_TRY(pre_byte_level(t, 1));
    } else if (!strcmp(name, "falcon")) {
        canon = "falcon";
        AT_TRY(tok_push_pre(t, &(tok_pre){.kind = TOK_PRE_PUNCT, .behavior = TOK_SPLIT_CONTIGUOUS}));
        AT_TRY(pre_byte_level(t, 1));
        AT_TRY(tok_push_pre(t, &(tok_pre){.kind = TOK_PRE_DIGITS}));
        AT_TRY(pre_regex(t, "[0-9][0-9][0-9]"));
    } else {
        return at_error(AT_ERR_UNSUPPORTED,
                        "tokenizer: pre-tokenizer family \"%s\" is not known (gpt2, llama3, qwen2, smollm, falcon)", name);
    }
    snprintf(t->pre_name, sizeof t->pre_name, "%s", canon);
    return tok_push_dec(t, &(tok_dec){.kind = TOK_DEC_BYTELEVEL});
}

/* ---- tokenizer_config.json --------------------------------------------- */

/* A token given as "text" or {"content": "text", ...}. */
static const char *token_text(const cJSON *v)
{
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static int jbool(const cJSON *o, const char *k, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static at_status read_json_opt(const char *dir, const char *name, cJSON **out)
{
    *out = NULL;
    char *p = at_path_join(dir, name);
    if (!p) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    at_status st = at_file_exists(p) ? at_json_parse_file(p, out) : AT_OK;
    free(p);
    return st;
}

static int32_t lookup_any(const at_tokenizer *t, const char *s)
{
    return s ? at_tokenizer_token_to_id(t, s) : -1;
}

at_status tok_read_config(at_tokenizer *t, const char *dir, int set_template)
{
    cJSON *cfg = NULL, *stm = NULL, *added = NULL;
    at_status st = AT_OK;
    int changed = 0;
    AT_CHECK(read_json_opt(dir, "tokenizer_config.json", &cfg));
    AT_CHECK(read_json_opt(dir, "special_tokens_map.json", &stm));
    AT_CHECK(read_json_opt(dir, "added_tokens.json", &added));

    /* Added tokens the config declares (tokenizer.json already has them;
     * vocab.json folders get them here). */
    const cJSON *dec = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder") : NULL;
    const cJSON *e;
    if (cJSON_IsObject(dec)) {
        cJSON_ArrayForEach(e, dec)
        {
            char *end;
            long id = strtol(e->string, &end, 10);
            const char *content = token_text(e);
            if (*end || id < 0 || id > 16777216 || !content) continue;
            if (tok_added_by_id(t, (int32_t)id)) continue;
            int special = jbool(e, "special", 0);
            AT_CHECK(tok_add_token(t, content, strlen(content), (int32_t)id, special, jbool(e, "lstrip", 0),
                                   jbool(e, "rstrip", 0), jbool(e, "single_word", 0), jbool(e, "normalized", !special)));
            changed = 1;
        }
    }
    const char *names[4] = {NULL, NULL, NULL, NULL};
    static const char *const keys[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    for (int k = 0; k < 4; k++) {
        if (cfg) names[k] = token_text(cJSON_GetObjectItemCaseSensitive(cfg, keys[k]));
        if (!names[k] && stm) names[k] = token_text(cJSON_GetObjectItemCaseSensitive(stm, keys[k]));
    }
    if (cJSON_IsObject(added)) {
        cJSON_ArrayForEach(e, added)
        {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 16777216.0) continue;
            if (tok_added_by_id(t, e->valueint)) continue;
            /* Legacy added_tokens.json: special when named as a special token. */
            int special = 0;
            for (int k = 0; k < 4; k++)
                if (names[k] && strcmp(names[k], e->string) == 0) special = 1;
            const cJSON *extra = stm ? cJSON_GetObjectItemCaseSensitive(stm, "additional_special_tokens") : NULL;
            const cJSON *x;
            cJSON_ArrayForEach(x, extra)
            {
                const char *s = token_text(x);
                if (s && strcmp(s, e->string) == 0) special = 1;
            }
            AT_CHECK(tok_add_token(t, e->string, strlen(e->string), e->valueint, special, 0, 0, 0, !special));
            changed = 1;
        }
    }
    if (changed) AT_CHECK(tok_added_finish(t));
    int32_t ids[4];
    for (int k = 0; k < 4; k++) ids[k] = lookup_any(t, names[k]);
    if (ids[0] >= 0) t->bos_id = ids[0];
    if (ids[1] >= 0) t->eos_id = ids[1];
    if (ids[2] >= 0) t->pad_id = ids[2];
    if (ids[3] >= 0) t->unk_id = ids[3];
    if (set_template && cfg) {
        int add_bos = jbool(cfg, "add_bos_token", 0), add_eos = jbool(cfg, "add_eos_token", 0);
        if (add_bos && t->bos_id >= 0 && t->post.n_pre == 0)
            AT_CHECK(tok_post_push(&t->post.pre, &t->post.n_pre, t->bos_id));
        if (add_eos && t->eos_id >= 0 && t->post.n_post == 0)
            AT_CHECK(tok_post_push(&t->post.post, &t->post.n_post, t->eos_id));
    }
done:
    cJSON_Delete(cfg);
    cJSON_Delete(stm);
    cJSON_Delete(added);
    return st;
}

/* ---- vocab.json + merges.txt -------------------------------------------- */

static at_status read_merges_txt(at_tokenizer *t, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    AT_TRY(at_read_file(path, &text, &len));
    at_status st = AT_OK;
    int32_t rank = 0;
    size_t lineno = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && text[j] != '\n') j++;
        size_t e = j;
        if (e > i && text[e - 1] == '\r') e--;
        lineno++;
        const char *line = text + i;
        size_t n = e - i;
        i = j + 1;
        if (n == 0 || (lineno == 1 && n >= 8 && memcmp(line, "#version", 8) == 0)) continue;
        const char *sp = memchr(line, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - line))) {
            st = at_error(AT_ERR_FORMAT, "%s:%zu: a merge is two tokens separated by one space", path, lineno);
            goto done;
        }
        char what[64];
        snprintf(what, sizeof what, "merges line %zu", lineno);
        st = tok_bpe_add_merge(&t->model, line, (size_t)(sp - line), sp + 1, n - (size_t)(sp + 1 - line), rank, path);
        if (st != AT_OK) goto done;
        rank++;
    }
done:
    free(text);
    return st;
}

/* Which family a vocab.json folder belongs to. */
static const char *choose_family(const at_tokenizer *t, const cJSON *cfg, const char **why)
{
    const cJSON *cls = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class") : NULL;
    const char *c = cJSON_IsString(cls) ? cls->valuestring : NULL;
    if (c) {
        *why = "tokenizer_config.json tokenizer_class";
        if (strstr(c, "Qwen")) return "qwen2";
        if (strstr(c, "GPT2") || strstr(c, "CodeGen") || strstr(c, "Roberta") || strstr(c, "GPTNeoX")) return "gpt2";
    }
    *why = "the vocabulary";
    if (tok_vocab_find(&t->model.vocab, "<|begin_of_text|>", 17) >= 0 ||
        at_tokenizer_token_to_id(t, "<|begin_of_text|>") >= 0 || t->model.vocab.n >= 128000)
        return "llama3";
    if (t->model.vocab.n >= 151000) return "qwen2";
    return "gpt2";
}

at_status tok_load_vocab_merges(const char *dir, const at_tokenizer_opts *opts, at_tokenizer **out)
{
    at_tokenizer *t = NULL;
    cJSON *vocab = NULL, *cfg = NULL;
    char *vp = NULL, *mp = NULL;
    at_status st;
    *out = NULL;
    vp = at_path_join(dir, "vocab.json");
    if (vp && !at_file_exists(vp)) {
        free(vp);
        vp = at_path_join(dir, "encoder.json");
        mp = at_path_join(dir, "vocab.bpe");
    } else {
        mp = at_path_join(dir, "merges.txt");
    }
    if (!vp || !mp) {
        st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    if (!at_file_exists(mp)) {
        st = at_error(AT_ERR_NOT_FOUND, "%s: missing (it goes with %s)", mp, vp);
        goto done;
    }
    AT_CHECK(at_json_parse_file(vp, &vocab));
    if (!cJSON_IsObject(vocab)) {
        st = at_error(AT_ERR_FORMAT, "%s: not a JSON object of token -> id", vp);
        goto done;
    }
    AT_CHECK(tok_new(&t));
    int32_t max_id = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 16777216.0) {
            st = at_error(AT_ERR_FORMAT, "%s: \"%.40s\" must map to an id between 0 and 2^24", vp, e->string);
            goto done;
        }
        if (e->valueint > max_id) max_id = e->valueint;
    }
    AT_CHECK(tok_bpe_init(&t->model, TOK_MODEL_BPE, max_id + 1));
    cJSON_ArrayForEach(e, vocab) AT_CHECK(tok_vocab_set(&t->model.vocab, e->valueint, e->string, strlen(e->string)));
    AT_CHECK(tok_vocab_index(&t->model.vocab));
    AT_CHECK(read_merges_txt(t, mp));
    AT_CHECK(read_json_opt(dir, "tokenizer_config.json", &cfg));
    AT_CHECK(tok_finish(t));
    AT_CHECK(tok_read_config(t, dir, 1));
    const char *why = "the caller";
    const char *fam = opts && opts->pre ? opts->pre : choose_family(t, cfg, &why);
    AT_CHECK(tok_use_family(t, fam));
    AT_CHECK(tok_added_finish(t)); /* the normalizer may have changed */
    at_log_info("tokenizer: %s: pre-tokenizer \"%s\" (chosen from %s)", dir, t->pre_name, why);
    /* GPT-2's vocab.json holds <|endoftext|> as a plain entry; it is its
     * special token (BOS and EOS). */
    if (t->n_added == 0) {
        int32_t id = tok_vocab_find(&t->model.vocab, "<|endoftext|>", 13);
        if (id >= 0) {
            AT_CHECK(tok_add_token(t, "<|endoftext|>", 13, id, 1, 0, 0, 0, 0));
            AT_CHECK(tok_added_finish(t));
            if (t->bos_id < 0) t->bos_id = id;
            if (t->eos_id < 0) t->eos_id = id;
        }
    }
    *out = t;
    t = NULL;
done:
    at_tokenizer_free(t);
    cJSON_Delete(vocab);
    cJSON_Delete(cfg);
    free(vp);
    free(mp);
    return st;
}

/* ---- llama2.c tokenizer.bin -------------------------------------------- */

at_status tok_load_llama2c(const char *path, at_tokenizer **out)
{
    at_mapped_file mf = {0};
    at_tokenizer *t = NULL;
    at_status st;
    *out = NULL;
    AT_CHECK(at_map_file(path, &mf));
    const uint8_t *p = mf.data;
    size_t n = mf.size, off = 4;
    int32_t max_len;
    if (n < 4) {
        st = at_error(AT_ERR_FORMAT, "%s: too short for a llama2.c tokenizer (%zu bytes)", path, n);
        goto done;
    }
    memcpy(&max_len, p, 4);
    if (max_len <= 0 || max_len > 65536) {
        st = at_error(AT_ERR_FORMAT, "%s: max_token_length %d is not plausible", path, (int)max_len);
        goto done;
    }
    /* The vocabulary size is not stored: the records run to the end. */
    int32_t count = 0;
    for (size_t o = off; o < n; count++) {
        int32_t len;
        if (n - o < 8) {
            st = at_error(AT_ERR_FORMAT, "%s: token %d: record header cut at byte %zu", path, (int)count, o);
            goto done;
        }
        memcpy(&len, p + o + 4, 4);
        if (len < 0 || (size_t)len > n - o - 8) {
            st = at_error(AT_ERR_FORMAT, "%s: token %d: length %d runs past the end of the file", path, (int)count,
                          (int)len);
            goto done;
        }
        o += 8 + (size_t)len;
    }
    if (count == 0) {
        st = at_error(AT_ERR_FORMAT, "%s: no tokens", path);
        goto done;
    }
    AT_CHECK(tok_new(&t));
    AT_CHECK(tok_bpe_init(&t->model, TOK_MODEL_SCORES, count));
    t->model.scores = malloc((size_t)count * sizeof(float));
    if (!t->model.scores) {
        st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    for (int32_t id = 0; id < count; id++) {
        int32_t len;
        memcpy(&t->model.scores[id], p + off, 4);
        memcpy(&len, p + off + 4, 4);
        AT_CHECK(tok_vocab_set(&t->model.vocab, id, (const char *)p + off + 8, (size_t)len));
        off += 8 + (size_t)len;
    }
    AT_CHECK(tok_vocab_index(&t->model.vocab));
    /* run.c: a character missing from the vocabulary becomes its bytes, as
     * ids byte + 3 (after <unk>, <s>, </s>). */
    if (count >= 259) {
        t->model.byte_fallback = 1;
        for (int b = 0; b < 256; b++) t->model.byte_ids[b] = b + 3;
    }
    /* run.c prepends the token for " " to non-empty text and merges over the
     * whole text, with raw spaces in the pieces. */
    AT_CHECK(tok_push_norm(t, &(tok_norm){.kind = TOK_NORM_PREPEND, .a = strdup(" "), .alen = 1}));
    if (!t->norm[0].a) {
        st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    AT_CHECK(tok_push_dec(t, &(tok_dec){.kind = TOK_DEC_BYTEFALLBACK}));
    AT_CHECK(tok_push_dec(t, &(tok_dec){.kind = TOK_DEC_FUSE}));
    AT_CHECK(tok_push_dec(t, &(tok_dec){.kind = TOK_DEC_STRIP, .strip_cp = ' ', .start = 1}));
    t->bos_id = count > 1 ? 1 : -1;
    t->eos_id = count > 2 ? 2 : -1;
    t->unk_id = 0;
    /* <unk>, <s>, </s>: special tokens under the names SentencePiece and
     * Hugging Face give them (tokenizer.bin stores them as "\n<s>\n" ...), so
     * a chat template's bos_token/eos_token text becomes these ids when the
     * caller parses special tokens, as with Llama 2's tokenizer.json. */
    static const char *const names[3] = {"<unk>", "<s>", "</s>"};
    for (int32_t id = 0; id < 3 && id < count; id++)
        AT_CHECK(tok_add_token(t, names[id], strlen(names[id]), id, 1, 0, 0, 0, 0));
    if (t->bos_id >= 0) {
        t->post.pre = malloc(sizeof(int32_t));
        if (!t->post.pre) {
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        t->post.pre[0] = t->bos_id;
        t->post.n_pre = 1;
    }
    snprintf(t->pre_name, sizeof t->pre_name, "llama2c");
    AT_CHECK(tok_finish(t));
    *out = t;
    t = NULL;
done:
    at_tokenizer_free(t);
    at_unmap_file(&mf);
    return st;
}

/* ---- arrays (GGUF) ------------------------------------------------------- */

at_status at_tokenizer_from_arrays(const at_tokenizer_arrays *a, at_tokenizer **out)
{
    at_tokenizer *t = NULL;
    at_status st;
    *out = NULL;
    if (!a || !a->model || !a->tokens || a->n_tokens == 0 || a->n_tokens > (1u << 24))
        return at_error(AT_ERR_INVALID, "tokenizer arrays: model, tokens and 1..2^24 tokens are required");
    int llama = strcmp(a->model, "llama") == 0;
    if (!llama && strcmp(a->model, "gpt2") != 0)
        return at_error(AT_ERR_UNSUPPORTED, "tokenizer arrays: tokenizer.ggml.model \"%s\" is not supported (gpt2, llama)",
                        a->model);
    if (llama && !a->scores) return at_error(AT_ERR_INVALID, "tokenizer arrays: llama model needs scores");
    AT_CHECK(tok_new(&t));
    int32_t n = (int32_t)a->n_tokens;
    AT_CHECK(tok_bpe_init(&t->model, llama ? TOK_MODEL_SCORES : TOK_MODEL_BPE, n));
    for (int32_t i = 0; i < n; i++) {
        if (!a->tokens[i]) {
            st = at_error(AT_ERR_INVALID, "tokenizer arrays: token %d is NULL", (int)i);
            goto done;
        }
        size_t len = a->token_lens ? a->token_lens[i] : strlen(a->tokens[i]);
        AT_CHECK(tok_vocab_set(&t->model.vocab, i, a->tokens[i], len));
    }
    AT_CHECK(tok_vocab_index(&t->model.vocab));
    if (llama) {
        t->model.scores = malloc((size_t)n * sizeof(float));
        if (!t->model.scores) {
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        memcpy(t->model.scores, a->scores, (size_t)n * sizeof(float));
        t->model.byte_fallback = 1;
    } else {
        for (size_t i = 0; i < a->n_merges; i++) {
            const char *m = a->merges[i];
            if (!m) {
                st = at_error(AT_ERR_INVALID, "tokenizer arrays: merge %zu is NULL", i);
                goto done;
            }
            size_t len = a->merge_lens ? a->merge_lens[i] : strlen(m);
            const char *sp = memchr(m, ' ', len);
            if (!sp) {
                st = at_error(AT_ERR_FORMAT, "tokenizer arrays: merge %zu \"%.*s\" has no space", i, (int)(len > 60 ? 60 : len), m);
                goto done;
            }
            AT_CHECK(tok_bpe_add_merge(&t->model, m, (size_t)(sp - m), sp + 1, len - (size_t)(sp + 1 - m), (int32_t)i,
                                       "tokenizer.ggml.merges"));
        }
    }
    /* Token types: control and unknown ("<unk>") tokens are special added
     * tokens, user-defined ones plain added tokens (all split out before the
     * model), as llama.cpp parses them and as Hugging Face lists "<unk>". */
    for (int32_t i = 0; a->token_types && i < n; i++) {
        int ty = a->token_types[i];
        if (ty == 2 && t->model.unk_id < 0) t->model.unk_id = i;
        if (ty == 2 || ty == 3 || ty == 4)
            AT_CHECK(tok_add_token(t, t->model.vocab.str[i], t->model.vocab.len[i], i, ty != 4, 0, 0, 0, 0));
    }
    if (a->unk_id >= 0 && a->unk_id < n) t->model.unk_id = a->unk_id;
    if (llama) {
        const char *sp = "\xE2\x96\x81";
        if (a->add_space_prefix) {
            AT_CHECK(tok_push_norm(t, &(tok_norm){.kind = TOK_NORM_PREPEND, .a = strdup(sp), .alen = 3}));
            if (!t->norm[t->n_norm - 1].a) {
                st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
                goto done;
            }
        }
        tok_norm r = {.kind = TOK_NORM_REPLACE, .a = strdup(" "), .alen = 1, .b = strdup(sp), .blen = 3};
        if (!r.a || !r.b) {
            tok_norm_free(&r);
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        AT_CHECK(tok_push_norm(t, &r));
        tok_dec d = {.kind = TOK_DEC_REPLACE, .a = strdup(sp), .alen = 3, .b = strdup(" "), .blen = 1};
        if (!d.a || !d.b) {
            tok_dec_free(&d);
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        AT_CHECK(tok_push_dec(t, &d));
        AT_CHECK(tok_push_dec(t, &(tok_dec){.kind = TOK_DEC_BYTEFALLBACK}));
        AT_CHECK(tok_push_dec(t, &(tok_dec){.kind = TOK_DEC_FUSE}));
        if (a->add_space_prefix) AT_CHECK(tok_push_dec(t, &(tok_dec){.kind = TOK_DEC_STRIP, .strip_cp = ' ', .start = 1}));
        snprintf(t->pre_name, sizeof t->pre_name, "llama-spm");
    } else {
        AT_CHECK(tok_use_family(t, a->pre && a->pre[0] ? a->pre : "default"));
    }
    t->bos_id = a->bos_id >= 0 && a->bos_id < n ? a->bos_id : -1;
    t->eos_id = a->eos_id >= 0 && a->eos_id < n ? a->eos_id : -1;
    t->pad_id = a->pad_id >= 0 && a->pad_id < n ? a->pad_id : -1;
    if (a->add_bos && t->bos_id >= 0) {
        t->post.pre = malloc(sizeof(int32_t));
        if (!t->post.pre) {
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        t->post.pre[0] = t->bos_id;
        t->post.n_pre = 1;
    }
    if (a->add_eos && t->eos_id >= 0) {
        t->post.post = malloc(sizeof(int32_t));
        if (!t->post.post) {
            st = at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        t->post.post[0] = t->eos_id;
        t->post.n_post = 1;
    }
    AT_CHECK(tok_finish(t));
    at_log_info("tokenizer: GGUF %s tokenizer, pre-tokenizer \"%s\"", a->model, t->pre_name);
    *out = t;
    t = NULL;
done:
    at_tokenizer_free(t);
    return st;
}
