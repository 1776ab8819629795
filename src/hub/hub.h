/* Models and datasets by name, from the Hugging Face Hub or ModelScope.
 *
 * A name is ORG/NAME with an optional @REVISION (a branch, tag or commit;
 * default "main" on Hugging Face, "master" on ModelScope). Files are kept in
 * each hub's own cache layout, so the Python tools on the same machine share
 * them:
 *   Hugging Face: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
 *     models--ORG--NAME/blobs/<sha256 for LFS files, git blob id for others>
 *     models--ORG--NAME/refs/<REVISION>            the commit it points to
 *     models--ORG--NAME/snapshots/<commit>/<path>  relative symlinks to ../../blobs/..
 *     (datasets under datasets--ORG--NAME; .locks/ beside them)
 *   ModelScope: $MODELSCOPE_CACHE, else ~/.cache/modelscope/hub
 *     models/ORG/NAME/<path> (dots in NAME spelled "___"), datasets/ORG/NAME/<path>;
 *     partial files under ._____temp/ there.
 * The API routes used (see hub.c): Hugging Face
 *   GET {endpoint}/api/{models|datasets}/{repo}/revision/{rev}?blobs=true
 *   GET {endpoint}/[datasets/]{repo}/resolve/{commit}/{path}   (302 to the CDN)
 * ModelScope
 *   GET {endpoint}/api/v1/models/{repo}/repo/files?Revision={rev}&Recursive=true
 *   GET {endpoint}/api/v1/datasets/{repo}/repo/tree?Revision={rev}&Root=/&Recursive=True&PageNumber=1&PageSize=10000
 *   GET {endpoint}/api/v1/{models|datasets}/{repo}/repo?Revision={rev}&FilePath={path}
 *
 * Environment: HF_ENDPOINT (a mirror), HF_TOKEN, HF_HUB_OFFLINE=1 (only the
 * cache; also for ModelScope), HF_HOME, HF_HUB_CACHE, MODELSCOPE_DOMAIN or
 * MODELSCOPE_ENDPOINT, MODELSCOPE_API_TOKEN, MODELSCOPE_CACHE.
 * Every path the hub lists is checked (relative, no "." or ".." parts, no
 * backslashes or control characters) before anything is written: a hostile
 * hub cannot write outside the repository's cache folder. */
#ifndef AT_HUB_HUB_H
#define AT_HUB_HUB_H

#include <stddef.h>
#include "base/status.h"
#include "hub/http.h"

typedef enum { AT_HUB_HF = 0, AT_HUB_MODELSCOPE } at_hub_kind;
typedef enum { AT_REPO_MODEL = 0, AT_REPO_DATASET } at_repo_kind;

typedef struct {
    at_hub_kind hub;
    const char *token;    /* NULL: HF_TOKEN / MODELSCOPE_API_TOKEN */
    const char *endpoint; /* NULL: from the environment, else the public hub */
    int offline;          /* only the cache (also set by HF_HUB_OFFLINE=1) */
    /* glob patterns (fnmatch, '*' crosses '/') of the files to fetch; none:
     * what a model needs (top-level *.json, *.safetensors, tokenizer and
     * template files; the GGUF file(s) of one quantization when the repo has
     * no safetensors) */
    const char *const *include;
    size_t n_include;
    const char *gguf;     /* a GGUF file name or quantization (e.g. Q4_K_M) to pick, or NULL */
    at_http_options http;
} at_hub_options;

/* 1 when s has the shape ORG/NAME[@REV] (datasets: also [:SUBSET]) and is
 * not an existing file or folder. */
int at_hub_is_name(const char *s, at_repo_kind kind);

/* Fetches what is missing of repository `name` into the cache and sets *dir
 * to the folder holding its files (a snapshot; caller frees). Errors say
 * what to do: 401/403 name the page where a gated model's license is
 * accepted and HF_TOKEN; 404 says whether the name or the revision is
 * unknown; offline with nothing cached says so. */
at_status at_hub_snapshot(const char *name, at_repo_kind kind, const at_hub_options *o, char **dir);

/* The train split's data files (.parquet, .jsonl, .json, .csv) of dataset
 * ORG/NAME[@REV][:SUBSET]: chosen from the repository's files (a SUBSET
 * folder or file prefix; files named for the train split, or all data files
 * when none is named for a split); on Hugging Face, when the repository has
 * no such files, from its Parquet conversion (revision refs/convert/parquet,
 * SUBSET/train/ Parquet files). *files (n of them, paths in the cache) and each
 * path are the caller's to free. */
at_status at_hub_dataset_files(const char *spec, const at_hub_options *o, char ***files, size_t *n);

/* The hub options' rows (base/options.h), for the tables of the commands
 * that take --model or --dataset: the program (cli/cmd_download.c) fetches
 * names there before the job runs. */
#define AT_HUB_OPTION_ROWS                                                                                          \
    {.name = "use_hf", .type = AT_OPT_BOOL, .def = "true",                                                           \
     .help = "hub names (ORG/NAME[@REV]) from the Hugging Face Hub; false: from ModelScope"},                        \
    {.name = "hub", .type = AT_OPT_STRING, .choices = "huggingface|modelscope",                                     \
     .help = "the hub of names (overrides --use_hf)"},                                                              \
    {.name = "hub_token", .type = AT_OPT_STRING,                                                                    \
     .help = "hub access token for gated or private repositories (default: HF_TOKEN / MODELSCOPE_API_TOKEN)"},        \
    {.name = "gguf_file", .type = AT_OPT_STRING,                                                                    \
     .help = "which GGUF of a hub repository: a file name or quantization (e.g. Q4_K_M)"}

/* The hub of a "huggingface"/"hf" or "modelscope"/"ms" name. */
at_status at_hub_parse_kind(const char *s, at_hub_kind *out);

#endif
