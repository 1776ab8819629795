/* Choosing a repository's files: what a model needs, one GGUF
 * quantization, a dataset's train split. */
#include <ctype.h>
#include <fnmatch.h>
#include <string.h>
#include <strings.h>
#include "hub/hub_internal.h"

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcasecmp(s + a - b, suf);
}

static int model_file(const char *p)
{
    static const char *const pats[] = {"*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "vocab.txt",
                                       "merges.txt", "*.jinja", "tokenizer.bin", "*.model"};
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++)
        if (fnmatch(pats[i], p, FNM_PATHNAME) == 0) return 1;
    return 0;
}

/* The GGUF a person most likely wants: the named file or quantization, else
 * Q4_K_M, else Q8_0, else the first (never a projector, mmproj-*). Shards
 * (-00001-of-00003.gguf) come together: keep[] marks all of them. */
static const char *pick_gguf(const at_hub_listing *L, const char *want)
{
    const char *prefs[] = {want, "Q4_K_M", "Q8_0", ""};
    for (size_t k = 0; k < sizeof prefs / sizeof prefs[0]; k++) {
        if (!prefs[k]) continue;
        for (size_t i = 0; i < L->n; i++) {
            const char *p = L->files[i].path, *base = strrchr(p, '/') ? strrchr(p, '/') + 1 : p;
            if (!has_suffix(p, ".gguf") || strncasecmp(base, "mmproj", 6) == 0) continue;
            if (!strcmp(p, prefs[k]) || !strcmp(base, prefs[k]) || strcasestr(p, prefs[k])) return p;
        }
    }
    return NULL;
}

/* The part of a GGUF path before its shard suffix -NNNNN-of-NNNNN.gguf. */
static size_t gguf_stem(const char *p)
{
    size_t n = strlen(p);
    const char *of = strstr(p, "-of-");
    if (of && of - p > 6 && has_suffix(p, ".gguf")) return (size_t)(of - p) - 6;
    return n;
}

static int included(const at_hub_options *o, const char *p)
{
    for (size_t i = 0; i < o->n_include; i++)
        if (fnmatch(o->include[i], p, 0) == 0) return 1;
    return 0;
}

at_status at_hub_select_model(const at_hub_options *o, const at_hub_listing *L, char *keep)
{
    size_t n_st = 0, n_keep = 0;
    for (size_t i = 0; i < L->n; i++) n_st += fnmatch("*.safetensors", L->files[i].path, FNM_PATHNAME) == 0;
    const char *gguf = NULL;
    if (!o->n_include && (o->gguf || !n_st)) gguf = pick_gguf(L, o->gguf);
    if (o->gguf && !o->n_include && !gguf)
        return at_error(AT_ERR_NOT_FOUND, "%s: no GGUF file matches '%s'", L->repo, o->gguf);
    for (size_t i = 0; i < L->n; i++) {
        const char *p = L->files[i].path;
        if (o->n_include) keep[i] = (char)included(o, p);
        else if (gguf && has_suffix(p, ".gguf"))
            keep[i] = (char)(gguf_stem(p) == gguf_stem(gguf) && !strncmp(p, gguf, gguf_stem(gguf)));
        else keep[i] = (char)(model_file(p) && !(gguf && has_suffix(p, ".safetensors")));
        n_keep += (size_t)keep[i];
    }
    if (!n_keep)
        return at_error(AT_ERR_NOT_FOUND, "%s: none of its %zu files %s", L->repo, L->n,
                        o->n_include ? "matches --include" : "is a model file (config, safetensors, GGUF, tokenizer)");
    return AT_OK;
}

static int data_ext(const char *p)
{
    return has_suffix(p, ".parquet") || has_suffix(p, ".jsonl") || has_suffix(p, ".csv") ||
           (has_suffix(p, ".json") && !has_suffix(p, "dataset_info.json") && !has_suffix(p, "dataset_infos.json") &&
            !has_suffix(p, "state.json") && !has_suffix(p, "config.json") && strncmp(p, ".", 1) != 0);
}

/* Whether path names split `split` as a word: a folder "train", or "train"
 * in the file name bounded by non-letters (train-0000.parquet, alpaca_train.json). */
static int names_split(const char *p, const char *split)
{
    size_t sl = strlen(split);
    for (const char *s = p; (s = strcasestr(s, split)); s += sl) {
        int before = s == p || !isalpha((unsigned char)s[-1]);
        int after = !isalpha((unsigned char)s[sl]);
        if (before && after) return 1;
    }
    return 0;
}

static int in_subset(const char *p, const char *subset)
{
    size_t sl = strlen(subset);
    for (const char *s = p;;) { /* a folder of that name */
        const char *e = strchr(s, '/');
        if (!e) break;
        if ((size_t)(e - s) == sl && !strncmp(s, subset, sl)) return 1;
        s = e + 1;
    }
    const char *base = strrchr(p, '/') ? strrchr(p, '/') + 1 : p;
    return !strncmp(base, subset, sl) && (base[sl] == '-' || base[sl] == '_' || base[sl] == '.');
}

size_t at_hub_select_data(const at_hub_listing *L, const char *subset, char *keep)
{
    static const char *const other[] = {"test", "validation", "valid", "dev", "eval"};
    size_t n_train = 0, n_other = 0, n = 0;
    for (size_t i = 0; i < L->n; i++) {
        const char *p = L->files[i].path;
        keep[i] = (char)(data_ext(p) && (!subset[0] || in_subset(p, subset)));
        if (!keep[i]) continue;
        if (names_split(p, "train")) n_train++;
        for (size_t k = 0; k < sizeof other / sizeof other[0]; k++)
            if (names_split(p, other[k])) {
                n_other++;
                break;
            }
    }
    for (size_t i = 0; i < L->n; i++) {
        if (keep[i] && (n_train || n_other)) keep[i] = (char)names_split(L->files[i].path, "train");
        n += (size_t)keep[i];
    }
    return n;
}

size_t at_hub_select_converted(const at_hub_listing *L, const char *subset, char *keep)
{
    const char *cfg = subset[0] ? subset : "default";
    size_t cl = strlen(cfg), k = 0;
    for (size_t i = 0; i < L->n; i++) {
        const char *p = L->files[i].path;
        keep[i] = (char)(has_suffix(p, ".parquet") && !strncmp(p, cfg, cl) && p[cl] == '/' &&
                         (!strncmp(p + cl + 1, "train/", 6) || !strncmp(p + cl + 1, "partial-train/", 14)));
        k += (size_t)keep[i];
    }
    return k;
}
