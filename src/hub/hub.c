/* Repositories by name: the hubs' routes, choosing files, and the caches. */
#include "hub/hub.h"
#include "hub/hub_internal.h"

#include <ctype.h>
#include <stdarg.h>
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include "base/file.h"
#include "base/log.h"

#define HF_DEFAULT_ENDPOINT "https://huggingface.co"
#define MS_DEFAULT_ENDPOINT "https://www.modelscope.cn"
#define MAX_FILES 100000


static void listing_free(at_hub_listing *L)
{
    for (size_t i = 0; i < L->n; i++) {
        free(L->files[i].path);
        free(L->files[i].blob);
        free(L->files[i].sha256);
    }
    free(L->files);
    free(L->root);
    free(L->files_dir);
    memset(L, 0, sizeof *L);
}

at_status at_hub_parse_kind(const char *s, at_hub_kind *out)
{
    if (!strcasecmp(s, "huggingface") || !strcasecmp(s, "hf")) *out = AT_HUB_HF;
    else if (!strcasecmp(s, "modelscope") || !strcasecmp(s, "ms")) *out = AT_HUB_MODELSCOPE;
    else return at_error(AT_ERR_INVALID, "unknown hub '%s' (huggingface or modelscope)", s);
    return AT_OK;
}

/* ---- names and paths ---- */

static int name_char(int c) { return isalnum(c) || c == '-' || c == '_' || c == '.'; }

/* ORG/NAME: two parts of [A-Za-z0-9._-], neither "." nor "..". */
static int valid_repo(const char *s, size_t len)
{
    const char *slash = memchr(s, '/', len);
    if (!slash || len > 190) return 0;
    size_t a = (size_t)(slash - s), b = len - a - 1;
    if (!a || !b) return 0;
    for (size_t i = 0; i < len; i++)
        if (i != a && !name_char((unsigned char)s[i])) return 0;
    if ((a == 1 && s[0] == '.') || (a == 2 && !strncmp(s, "..", 2))) return 0;
    if ((b == 1 && slash[1] == '.') || (b == 2 && !strncmp(slash + 1, "..", 2))) return 0;
    return 1;
}

/* A relative path inside a repository: no empty, "." or ".." parts, no
 * leading '/', no backslash or control characters. Revisions follow the
 * same rule (they may hold '/', as refs/convert/parquet does). */
static int safe_relpath(const char *p)
{
    size_t len = strlen(p);
    if (!len || len > 1024 || p[0] == '/') return 0;
    for (const char *s = p;;) {
        const char *e = strchr(s, '/');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (l == 0 || (l == 1 && s[0] == '.') || (l == 2 && s[0] == '.' && s[1] == '.')) return 0;
        if (!e) break;
        s = e + 1;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x20 || c == 0x7f || c == '\\') return 0;
    }
    return 1;
}

static int is_hex(const char *s, size_t n)
{
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i])) return 0;
    return 1;
}

/* Splits ORG/NAME[@REV][:SUBSET] (SUBSET only for datasets). */
static int parse_name(const char *s, at_repo_kind kind, char *repo, char *rev, char *subset, size_t cap)
{
    size_t len = strlen(s);
    const char *colon = kind == AT_REPO_DATASET ? strchr(s, ':') : NULL;
    if (colon) {
        if (!colon[1] || strlen(colon + 1) >= cap || !safe_relpath(colon + 1) || strchr(colon + 1, '/')) return 0;
        if (subset) strcpy(subset, colon + 1);
        len = (size_t)(colon - s);
    } else if (subset) {
        subset[0] = '\0';
    }
    const char *at = memchr(s, '@', len);
    size_t rlen = at ? (size_t)(at - s) : len;
    if (!valid_repo(s, rlen) || rlen >= cap) return 0;
    if (repo) {
        memcpy(repo, s, rlen);
        repo[rlen] = '\0';
    }
    if (at) {
        size_t vl = len - rlen - 1;
        char tmp[256];
        if (!vl || vl >= cap || vl >= sizeof tmp) return 0;
        memcpy(tmp, at + 1, vl);
        tmp[vl] = '\0';
        if (!safe_relpath(tmp)) return 0;
        if (rev) strcpy(rev, tmp);
    } else if (rev) {
        rev[0] = '\0';
    }
    return 1;
}

int at_hub_is_name(const char *s, at_repo_kind kind)
{
    struct stat sb;
    if (!s || stat(s, &sb) == 0) return 0;
    char repo[256], rev[256], subset[256];
    return parse_name(s, kind, repo, rev, subset, sizeof repo);
}

/* Percent-encodes s; '/' kept when keep_slash. Caller frees. */
static char *url_encode(const char *s, int keep_slash)
{
    char *o = malloc(strlen(s) * 3 + 1), *p = o;
    if (!o) return NULL;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) *p++ = (char)c;
        else p += sprintf(p, "%%%02X", c);
    }
    *p = '\0';
    return o;
}

static char *strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *strf(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static int env_true(const char *name)
{
    const char *v = env(name);
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
}

static char *cache_root(at_hub_kind hub)
{
    const char *home = env("HOME") ? env("HOME") : "/tmp";
    if (hub == AT_HUB_MODELSCOPE)
        return env("MODELSCOPE_CACHE") ? strdup(env("MODELSCOPE_CACHE")) : strf("%s/.cache/modelscope/hub", home);
    if (env("HF_HUB_CACHE")) return strdup(env("HF_HUB_CACHE"));
    if (env("HF_HOME")) return strf("%s/hub", env("HF_HOME"));
    if (env("XDG_CACHE_HOME")) return strf("%s/huggingface/hub", env("XDG_CACHE_HOME"));
    return strf("%s/.cache/huggingface/hub", home);
}

static const char *endpoint(const at_hub_options *o)
{
    if (o->endpoint) return o->endpoint;
    if (o->hub == AT_HUB_MODELSCOPE) {
        if (env("MODELSCOPE_ENDPOINT")) return env("MODELSCOPE_ENDPOINT");
        return env("MODELSCOPE_DOMAIN") ? env("MODELSCOPE_DOMAIN") : MS_DEFAULT_ENDPOINT;
    }
    return env("HF_ENDPOINT") ? env("HF_ENDPOINT") : HF_DEFAULT_ENDPOINT;
}

/* "models--ORG--NAME" (HF) or "models/ORG/NA___ME" (ModelScope). */
static char *repo_folder(const at_hub_listing *L)
{
    const char *kind = L->kind == AT_REPO_DATASET ? "datasets" : "models";
    const char *slash = strchr(L->repo, '/');
    int olen = (int)(slash - L->repo);
    if (L->hub == AT_HUB_HF) return strf("%s--%.*s--%s", kind, olen, L->repo, slash + 1);
    char name[600], *p = name;
    for (const char *s = slash + 1; *s; s++) {
        if (*s == '.') p += sprintf(p, "___");
        else *p++ = *s;
    }
    *p = '\0';
    return strf("%s/%.*s/%s", kind, olen, L->repo, name);
}

/* ---- listing a repository: online ---- */

static at_status add_file(at_hub_listing *L, const char *path, const char *blob, const char *sha256, long long size)
{
    if (!safe_relpath(path))
        return at_error(AT_ERR_FORMAT, "%s: the hub lists the file \"%.200s\", a path that would leave the repository's "
                        "folder; refusing it", L->repo, path);
    if (L->n >= MAX_FILES) return at_error(AT_ERR_FORMAT, "%s: the hub lists more than %d files", L->repo, MAX_FILES);
    if (L->n % 64 == 0) {
        at_hub_file *nf = realloc(L->files, (L->n + 64) * sizeof *nf);
        if (!nf) return at_error(AT_ERR_NOMEM, "out of memory");
        L->files = nf;
    }
    at_hub_file *f = &L->files[L->n];
    memset(f, 0, sizeof *f);
    f->size = size;
    f->path = strdup(path);
    f->blob = blob ? strdup(blob) : NULL;
    f->sha256 = sha256 ? strdup(sha256) : NULL;
    L->n++;
    if (!f->path || (blob && !f->blob) || (sha256 && !f->sha256)) return at_error(AT_ERR_NOMEM, "out of memory");
    return AT_OK;
}

/* An error from the API call, said the way a person can act on it. */
static at_status api_error(const at_hub_listing *L, const at_http_reply *r, at_status st)
{
    const char *hub = L->hub == AT_HUB_HF ? "the Hugging Face Hub" : "ModelScope";
    const char *page_kind = L->kind == AT_REPO_DATASET ? "datasets/" : "";
    if (r->status == 401 || r->status == 403) {
        if (L->hub == AT_HUB_HF)
            return at_error(AT_ERR_INVALID,
                            "%s: access denied by %s (HTTP %ld): the repository is gated or private. Accept the "
                            "license at %s/%s%s and set HF_TOKEN (or --hub_token) to a token of that account",
                            L->repo, hub, r->status, L->endpoint, page_kind, L->repo);
        return at_error(AT_ERR_INVALID,
                        "%s: access denied by %s (HTTP %ld): the repository is gated or private; request access on "
                        "its page and set MODELSCOPE_API_TOKEN (or --hub_token)", L->repo, hub, r->status);
    }
    if (r->status == 404) {
        if (!strcmp(r->error_code, "RevisionNotFound"))
            return at_error(AT_ERR_NOT_FOUND, "%s: no revision '%s' on %s (HTTP 404): check @REVISION", L->repo,
                            L->rev, hub);
        return at_error(AT_ERR_NOT_FOUND,
                        "%s: not found on %s (HTTP 404): check the name%s and the revision '%s' (a private "
                        "repository also answers 404 without a token)",
                        L->repo, hub, L->kind == AT_REPO_DATASET ? " (and that it is a dataset)" : "", L->rev);
    }
    return at_error_wrap(st, "%s: listing the files on %s", L->repo, hub);
}

/* GETs a listing at url (taken over; NULL: out of memory), failures said as api_error does. */
static at_status api_get(const at_hub_options *o, const at_hub_listing *L, char *url, cJSON **j)
{
    if (!url) return at_error(AT_ERR_NOMEM, "out of memory");
    at_http_reply reply;
    at_status st = at_http_get_json(&o->http, url, j, &reply);
    if (st != AT_OK) st = api_error(L, &reply, st);
    free(url);
    return st;
}

static at_status list_hf(const at_hub_options *o, at_hub_listing *L)
{
    at_status st = AT_OK;
    cJSON *j = NULL;
    char *rev = url_encode(L->rev, 0);
    st = api_get(o, L, rev ? strf("%s/api/%s/%s/revision/%s?blobs=true", L->endpoint,
                                  L->kind == AT_REPO_DATASET ? "datasets" : "models", L->repo, rev) : NULL, &j);
    free(rev);
    if (st != AT_OK) goto done;
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(j, "sha");
    const cJSON *sib = cJSON_GetObjectItemCaseSensitive(j, "siblings");
    if (!cJSON_IsString(sha) || !is_hex(sha->valuestring, 40) || !cJSON_IsArray(sib)) {
        st = at_error(AT_ERR_FORMAT, "%s: the hub's answer for revision %s has no commit sha or file list", L->repo,
                      L->rev);
        goto done;
    }
    strcpy(L->commit, sha->valuestring);
    const cJSON *s;
    cJSON_ArrayForEach(s, sib)
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "rfilename");
        const cJSON *blob = cJSON_GetObjectItemCaseSensitive(s, "blobId");
        const cJSON *size = cJSON_GetObjectItemCaseSensitive(s, "size");
        const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(s, "lfs");
        const cJSON *lsha = cJSON_GetObjectItemCaseSensitive(lfs, "sha256");
        const cJSON *lsize = cJSON_GetObjectItemCaseSensitive(lfs, "size");
        if (!cJSON_IsString(name)) continue;
        const char *b = NULL, *h = NULL;
        long long sz = cJSON_IsNumber(size) ? (long long)size->valuedouble : -1;
        if (cJSON_IsString(lsha)) {
            if (!is_hex(lsha->valuestring, 64)) {
                st = at_error(AT_ERR_FORMAT, "%s: %s: malformed sha256 '%.80s'", L->repo, name->valuestring,
                              lsha->valuestring);
                goto done;
            }
            b = h = lsha->valuestring;
            if (cJSON_IsNumber(lsize)) sz = (long long)lsize->valuedouble;
        } else if (cJSON_IsString(blob) && is_hex(blob->valuestring, 40)) {
            b = blob->valuestring;
        }
        AT_CHECK(add_file(L, name->valuestring, b, h, sz));
    }
done:
    cJSON_Delete(j);
    return st;
}

static at_status list_ms(const at_hub_options *o, at_hub_listing *L)
{
    at_status st = AT_OK;
    cJSON *j = NULL;
    char *rev = url_encode(L->rev, 0);
    char *url = !rev ? NULL
                : L->kind == AT_REPO_DATASET
                    ? strf("%s/api/v1/datasets/%s/repo/tree?Revision=%s&Root=/&Recursive=True&PageNumber=1&PageSize=10000",
                           L->endpoint, L->repo, rev)
                    : strf("%s/api/v1/models/%s/repo/files?Revision=%s&Recursive=true", L->endpoint, L->repo, rev);
    free(rev);
    AT_CHECK(api_get(o, L, url, &j));
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(j, "Code");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "Data"), "Files");
    if ((cJSON_IsNumber(code) && code->valuedouble != 200) || !cJSON_IsArray(files)) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "Message");
        st = at_error(AT_ERR_NOT_FOUND, "%s: ModelScope answered: %s (check the name and the revision '%s')", L->repo,
                      cJSON_IsString(m) ? m->valuestring : "no file list", L->rev);
        goto done;
    }
    const cJSON *f;
    cJSON_ArrayForEach(f, files)
    {
        const cJSON *path = cJSON_GetObjectItemCaseSensitive(f, "Path");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(f, "Type");
        const cJSON *size = cJSON_GetObjectItemCaseSensitive(f, "Size");
        const cJSON *sha = cJSON_GetObjectItemCaseSensitive(f, "Sha256");
        if (!cJSON_IsString(path) || (cJSON_IsString(type) && strcmp(type->valuestring, "blob") != 0)) continue;
        const char *h = cJSON_IsString(sha) && is_hex(sha->valuestring, 64) ? sha->valuestring : NULL;
        AT_CHECK(add_file(L, path->valuestring, NULL, h, cJSON_IsNumber(size) ? (long long)size->valuedouble : -1));
    }
done:
    cJSON_Delete(j);
    return st;
}

/* ---- listing a repository: offline, from the cache ---- */

static at_status walk(at_hub_listing *L, const char *base, const char *rel)
{
    char *dir = rel[0] ? strf("%s/%s", base, rel) : strdup(base);
    if (!dir) return at_error(AT_ERR_NOMEM, "out of memory");
    DIR *d = opendir(dir);
    at_status st = AT_OK;
    if (!d) {
        free(dir);
        return AT_OK;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue; /* also ModelScope's ._____temp */
        char *r = rel[0] ? strf("%s/%s", rel, e->d_name) : strdup(e->d_name);
        char *full = strf("%s/%s", dir, e->d_name);
        struct stat sb;
        if (!r || !full) st = at_error(AT_ERR_NOMEM, "out of memory");
        else if (stat(full, &sb) == 0 && S_ISDIR(sb.st_mode)) st = walk(L, base, r);
        else if (stat(full, &sb) == 0 && S_ISREG(sb.st_mode)) st = add_file(L, r, NULL, NULL, (long long)sb.st_size);
        free(r);
        free(full);
        if (st != AT_OK) break;
    }
    closedir(d);
    free(dir);
    return st;
}

static at_status read_ref(const at_hub_listing *L, char *commit)
{
    if (is_hex(L->rev, 40)) {
        strcpy(commit, L->rev);
        return AT_OK;
    }
    char *path = strf("%s/refs/%s", L->root, L->rev), *text = NULL;
    size_t len = 0;
    at_status st = path ? at_read_file(path, &text, &len) : AT_ERR_NOMEM;
    free(path);
    if (st != AT_OK) return st;
    while (len && isspace((unsigned char)text[len - 1])) text[--len] = '\0';
    st = is_hex(text, 40) ? AT_OK : AT_ERR_FORMAT;
    if (st == AT_OK) strcpy(commit, text);
    free(text);
    return st;
}

static at_status list_cache(at_hub_listing *L)
{
    if (L->hub == AT_HUB_HF) {
        if (read_ref(L, L->commit) != AT_OK) return AT_ERR_NOT_FOUND;
        free(L->files_dir);
        L->files_dir = strf("%s/snapshots/%s", L->root, L->commit);
        if (!L->files_dir) return at_error(AT_ERR_NOMEM, "out of memory");
    }
    if (!at_is_dir(L->files_dir)) return AT_ERR_NOT_FOUND;
    AT_TRY(walk(L, L->files_dir, ""));
    return L->n ? AT_OK : AT_ERR_NOT_FOUND;
}

static at_status open_listing(const char *name, at_repo_kind kind, const at_hub_options *o, int offline, at_hub_listing *L)
{
    memset(L, 0, sizeof *L);
    L->hub = o->hub;
    L->kind = kind;
    L->endpoint = endpoint(o);
    if (!parse_name(name, kind, L->repo, L->rev, NULL, sizeof L->repo))
        return at_error(AT_ERR_INVALID, "'%s' is neither a local path nor a hub name ORG/NAME[@REVISION]%s", name,
                        kind == AT_REPO_DATASET ? "[:SUBSET]" : "");
    if (!L->rev[0]) strcpy(L->rev, o->hub == AT_HUB_HF ? "main" : "master");
    char *root = cache_root(o->hub), *folder = repo_folder(L);
    L->root = root && folder ? strf("%s/%s", root, folder) : NULL;
    free(root);
    free(folder);
    if (!L->root) return at_error(AT_ERR_NOMEM, "out of memory");
    if (o->hub == AT_HUB_MODELSCOPE && !(L->files_dir = strdup(L->root))) return at_error(AT_ERR_NOMEM, "out of memory");
    if (offline) {
        if (list_cache(L) == AT_OK) return AT_OK;
        return at_error(AT_ERR_NOT_FOUND,
                        "%s (revision %s) is not in the cache (%s) and HF_HUB_OFFLINE is set: run once with the "
                        "network, or unset HF_HUB_OFFLINE",
                        L->repo, L->rev, L->root);
    }
    at_status st = o->hub == AT_HUB_HF ? list_hf(o, L) : list_ms(o, L);
    if (st == AT_ERR_IO) { /* no answer at all: a cached copy will do, as huggingface_hub does */
        char *msg = strdup(at_last_error());
        at_hub_listing C;
        memset(&C, 0, sizeof C);
        C = *L;
        C.files = NULL;
        C.n = 0;
        C.root = strdup(L->root);
        C.files_dir = L->files_dir ? strdup(L->files_dir) : NULL;
        if (C.root && list_cache(&C) == AT_OK) {
            at_log_warn("%s; using the copy in the cache (%s)", msg ? msg : "the hub did not answer", C.root);
            listing_free(L);
            *L = C;
            free(msg);
            return AT_OK;
        }
        listing_free(&C);
        at_error(AT_ERR_IO, "%s", msg ? msg : "the hub did not answer");
        free(msg);
        return AT_ERR_IO;
    }
    if (st == AT_OK && o->hub == AT_HUB_HF && !(L->files_dir = strf("%s/snapshots/%s", L->root, L->commit)))
        return at_error(AT_ERR_NOMEM, "out of memory");
    return st;
}

/* ---- fetching into the cache ---- */

/* HF: snapshots/<commit>/<path> -> ../../blobs/<blob> (one more ../ per folder in path). */
static at_status link_snapshot(const at_hub_listing *L, const at_hub_file *f)
{
    at_status st = AT_OK;
    char *link = strf("%s/%s", L->files_dir, f->path), *target = NULL, *tmp = NULL;
    size_t depth = 2;
    for (const char *s = f->path; *s; s++) depth += *s == '/';
    size_t tl = depth * 3 + strlen(f->blob) + 8;
    target = malloc(tl);
    if (!link || !target) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    target[0] = '\0';
    for (size_t i = 0; i < depth; i++) strcat(target, "../");
    strcat(target, "blobs/");
    strcat(target, f->blob);
    char have[512];
    ssize_t hl = readlink(link, have, sizeof have - 1);
    if (hl > 0 && (size_t)hl == strlen(target) && !memcmp(have, target, (size_t)hl)) goto done;
    char *slash = strrchr(link, '/');
    *slash = '\0';
    st = at_mkdirs(link);
    *slash = '/';
    if (st != AT_OK) goto done;
    tmp = strf("%s.tmp%ld", link, (long)getpid());
    if (!tmp) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    unlink(tmp);
    if (symlink(target, tmp) != 0 || rename(tmp, link) != 0) {
        st = at_error(AT_ERR_IO, "%s: cannot link %s: %s", L->repo, link, strerror(errno));
        unlink(tmp);
    }
done:
    free(link);
    free(target);
    free(tmp);
    return st;
}

static at_status write_ref(const at_hub_listing *L)
{
    if (is_hex(L->rev, 40)) return AT_OK;
    char *path = strf("%s/refs/%s", L->root, L->rev);
    if (!path) return at_error(AT_ERR_NOMEM, "out of memory");
    char *slash = strrchr(path, '/');
    *slash = '\0';
    at_status st = at_mkdirs(path);
    *slash = '/';
    if (st == AT_OK) st = at_write_file_atomic(path, L->commit, strlen(L->commit));
    free(path);
    return st;
}

/* A file the listing gave no blob id for (a mirror without ?blobs=true):
 * HEAD its resolve URL, as huggingface_hub does: the ETag (X-Linked-Etag for
 * large files, on the 302) names the blob; a sha256 one is also checked. */
static at_status head_blob(const at_hub_options *o, const at_hub_listing *L, at_hub_file *f, const char *url)
{
    char etag[96];
    long long size = -1;
    at_http_reply reply;
    at_status st = at_http_head(&o->http, url, etag, &size, &reply);
    if (st != AT_OK) return reply.status ? api_error(L, &reply, st) : st;
    int sha = is_hex(etag, 64);
    if (!sha && !is_hex(etag, 40))
        return at_error(AT_ERR_FORMAT, "%s: %s: the hub names it by neither a sha256 nor a git blob id (ETag '%s')",
                        L->repo, f->path, etag);
    f->blob = strdup(etag);
    if (sha && !f->sha256) f->sha256 = strdup(etag);
    if (size >= 0) f->size = size;
    return f->blob && (!sha || f->sha256) ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
}

/* Downloads the kept files (those not yet in place). */
static at_status fetch(const at_hub_options *o, at_hub_listing *L, const char *keep, int offline)
{
    at_status st = AT_OK;
    size_t k = 0, n = 0;
    for (size_t i = 0; i < L->n; i++) n += (size_t)keep[i];
    at_http_file *hf = calloc(n + 1, sizeof *hf);
    char **strs = calloc(4 * n + 1, sizeof *strs);
    char *locks = NULL, *blobs = NULL;
    if (!hf || !strs) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (offline) { /* the listing came from the cache: every kept file is there */
        goto done;
    }
    if (L->hub == AT_HUB_HF) {
        char *root = cache_root(L->hub), *folder = repo_folder(L);
        locks = root && folder ? strf("%s/.locks/%s", root, folder) : NULL;
        free(root);
        free(folder);
        blobs = strf("%s/blobs", L->root);
        if (!locks || !blobs) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        AT_CHECK(at_mkdirs(blobs));
        AT_CHECK(at_mkdirs(locks));
    } else {
        char *tmp = strf("%s/._____temp", L->root);
        st = tmp ? at_mkdirs(tmp) : AT_ERR_NOMEM;
        free(tmp);
        if (st != AT_OK) goto done;
    }
    char *rev = url_encode(L->rev, 0);
    if (!rev) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < L->n; i++) {
        if (!keep[i]) continue;
        at_hub_file *f = &L->files[i];
        at_http_file *h = &hf[k];
        char **s = &strs[4 * k];
        char *path = url_encode(f->path, L->hub == AT_HUB_HF);
        if (!path) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        if (L->hub == AT_HUB_HF) {
            s[0] = strf("%s/%s%s/resolve/%s/%s", L->endpoint, L->kind == AT_REPO_DATASET ? "datasets/" : "", L->repo,
                        L->commit, path);
            if (!f->blob && s[0] && (st = head_blob(o, L, f, s[0])) != AT_OK) {
                free(path);
                break;
            }
            s[1] = strf("%s/%s", blobs, f->blob);
            s[2] = strf("%s/%s.incomplete", blobs, f->blob);
            s[3] = strf("%s/%s.lock", locks, f->blob);
        } else {
            s[0] = strf("%s/api/v1/%s/%s/repo?Revision=%s&FilePath=%s", L->endpoint,
                        L->kind == AT_REPO_DATASET ? "datasets" : "models", L->repo, rev, path);
            s[1] = strf("%s/%s", L->root, f->path);
            s[2] = strf("%s/._____temp/%s.incomplete", L->root, f->path);
            s[3] = NULL;
            struct stat sb; /* a file of another size is from another revision: fetch it again */
            if (s[1] && stat(s[1], &sb) == 0 && f->size >= 0 && (long long)sb.st_size != f->size) unlink(s[1]);
            for (int q = 1; q <= 2 && s[q]; q++) {
                char *slash = strrchr(s[q], '/');
                *slash = '\0';
                st = at_mkdirs(s[q]);
                *slash = '/';
                if (st != AT_OK) break;
            }
        }
        free(path);
        if (st != AT_OK) break;
        if (!s[0] || !s[1] || !s[2] || (L->hub == AT_HUB_HF && !s[3])) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        *h = (at_http_file){s[0], s[2], s[1], s[3], f->sha256, f->size, f->path};
        k++;
    }
    free(rev);
    if (st != AT_OK) goto done;
    at_log_info("%s: %zu file%s from %s (revision %s%s%s)", L->repo, k, k == 1 ? "" : "s", L->endpoint, L->rev,
                L->commit[0] ? ", commit " : "", L->commit);
    at_http_reply reply;
    st = at_http_download(&o->http, hf, k, &reply);
    if (st != AT_OK && (reply.status == 401 || reply.status == 403 || reply.status == 404))
        st = api_error(L, &reply, st);
    if (st != AT_OK) goto done;
    if (L->hub == AT_HUB_HF) {
        AT_CHECK(write_ref(L));
        for (size_t i = 0; i < L->n; i++)
            if (keep[i]) AT_CHECK(link_snapshot(L, &L->files[i]));
    }
done:
    for (size_t i = 0; strs && i < 4 * n; i++) free(strs[i]);
    free(strs);
    free(hf);
    free(locks);
    free(blobs);
    return st;
}

static int offline_mode(const at_hub_options *o) { return o->offline || env_true("HF_HUB_OFFLINE"); }

/* o with the token filled in from the environment when not given. */
static at_hub_options with_token(const at_hub_options *o)
{
    at_hub_options e = *o;
    if (!e.token) e.token = env(o->hub == AT_HUB_HF ? "HF_TOKEN" : "MODELSCOPE_API_TOKEN");
    e.http.token = e.token;
    return e;
}

at_status at_hub_snapshot(const char *name, at_repo_kind kind, const at_hub_options *given, char **dir)
{
    at_hub_options eo = with_token(given), *o = &eo;
    *dir = NULL;
    at_hub_listing L;
    int offline = offline_mode(o);
    at_status st = open_listing(name, kind, o, offline, &L);
    char *keep = NULL;
    if (st != AT_OK) goto done;
    keep = calloc(L.n + 1, 1);
    if (!keep) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (kind == AT_REPO_DATASET && !o->n_include) memset(keep, 1, L.n);
    else AT_CHECK(at_hub_select_model(o, &L, keep));
    AT_CHECK(fetch(o, &L, keep, offline));
    *dir = strdup(L.files_dir);
    if (!*dir) st = at_error(AT_ERR_NOMEM, "out of memory");
done:
    free(keep);
    listing_free(&L);
    return st;
}

at_status at_hub_dataset_files(const char *spec, const at_hub_options *given, char ***files, size_t *n)
{
    at_hub_options eo = with_token(given), *o = &eo;
    *files = NULL;
    *n = 0;
    char repo[256], rev[256], subset[256];
    if (!parse_name(spec, AT_REPO_DATASET, repo, rev, subset, sizeof repo))
        return at_error(AT_ERR_INVALID, "'%s' is neither a local file nor a dataset name ORG/NAME[@REVISION][:SUBSET]",
                        spec);
    int offline = offline_mode(o);
    at_hub_listing L;
    char *keep = NULL, *name = strf("%s%s%s", repo, rev[0] ? "@" : "", rev);
    at_status st = name ? open_listing(name, AT_REPO_DATASET, o, offline, &L) : AT_ERR_NOMEM;
    size_t k = 0;
    if (st != AT_OK) {
        free(name);
        listing_free(&L);
        return st;
    }
    keep = calloc(L.n + 1, 1);
    if (!keep) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    k = at_hub_select_data(&L, subset, keep);
    if (!k && o->hub == AT_HUB_HF && !rev[0]) { /* the Hub's Parquet conversion of the dataset */
        listing_free(&L);
        free(name);
        name = strf("%s@refs/convert/parquet", repo);
        AT_CHECK(name ? open_listing(name, AT_REPO_DATASET, o, offline, &L) : AT_ERR_NOMEM);
        free(keep);
        keep = calloc(L.n + 1, 1);
        if (!keep) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        k = at_hub_select_converted(&L, subset, keep);
    }
    if (!k) {
        st = at_error(AT_ERR_NOT_FOUND, "%s: no data files (.parquet, .jsonl, .json, .csv)%s%s%s for the train split",
                      repo, subset[0] ? " in subset '" : "", subset, subset[0] ? "'" : "");
        goto done;
    }
    AT_CHECK(fetch(o, &L, keep, offline));
    *files = calloc(k, sizeof **files);
    if (!*files) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < L.n; i++)
        if (keep[i]) {
            char *p = strf("%s/%s", L.files_dir, L.files[i].path);
            if (!p) {
                st = at_error(AT_ERR_NOMEM, "out of memory");
                goto done;
            }
            (*files)[(*n)++] = p;
        }
done:
    if (st != AT_OK && *files) {
        for (size_t i = 0; i < *n; i++) free((*files)[i]);
        free(*files);
        *files = NULL;
        *n = 0;
    }
    free(keep);
    free(name);
    listing_free(&L);
    return st;
}
