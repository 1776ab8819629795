#include "model/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "device/cpu/cpu_backend.h"

struct at_st_file {
    at_mapped_file map;
    int mapped;
    const uint8_t *bytes;
    size_t size;
    const uint8_t *data_area;
    size_t data_size;
    char *what;
    at_st_info *infos; /* sorted by offset */
    char **names;      /* owned strings, parallel to infos */
    size_t n;
    const at_st_info **by_name; /* sorted by name, for bsearch */
    char **meta_keys;
    char **meta_vals;
    size_t n_meta;
};

/* ---- dtypes ------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
    int has;
    at_dtype dtype;
} st_dtypes[] = {
    {"F64", 8, 0, AT_F32},     {"F32", 4, 1, AT_F32},     {"F16", 2, 1, AT_F16},
    {"BF16", 2, 1, AT_BF16},   {"I64", 8, 0, AT_F32},     {"I32", 4, 1, AT_I32},
    {"I16", 2, 0, AT_F32},     {"I8", 1, 0, AT_F32},      {"U64", 8, 0, AT_F32},
    {"U32", 4, 0, AT_F32},     {"U16", 2, 0, AT_F32},     {"U8", 1, 0, AT_F32},
    {"BOOL", 1, 0, AT_F32},    {"F8_E4M3", 1, 0, AT_F32}, {"F8_E5M2", 1, 0, AT_F32},
    {"F8_E8M0", 1, 0, AT_F32},
};

static int st_dtype_lookup(const char *name)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, name) == 0) return (int)i;
    return -1;
}

static const char *st_dtype_of(at_dtype t)
{
    switch (t) {
    case AT_F32: return "F32";
    case AT_BF16: return "BF16";
    case AT_F16: return "F16";
    case AT_I32: return "I32";
    default: return NULL;
    }
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* ---- parsing ------------------------------------------------------------ */

static uint64_t rd_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Exact non-negative integer from a JSON number (doubles are exact to 2^53). */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0) || d != floor(d) || d > 9007199254740992.0) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Any duplicate among n strings: returns one, else NULL. */
static const char *find_duplicate(const char **names, size_t n)
{
    if (n < 2) return NULL;
    const char **s = malloc(n * sizeof *s);
    if (!s) return NULL;
    memcpy(s, names, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_str_ptr);
    const char *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (strcmp(s[i - 1], s[i]) == 0) dup = s[i];
    free(s);
    return dup;
}

static int cmp_info_offset(const void *a, const void *b)
{
    const at_st_info *x = a, *y = b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_info_name(const void *a, const void *b)
{
    const at_st_info *x = *(const at_st_info *const *)a, *y = *(const at_st_info *const *)b;
    return strcmp(x->name, y->name);
}

static at_status parse_metadata(at_st_file *f, const cJSON *meta)
{
    if (!cJSON_IsObject(meta))
        return at_error(AT_ERR_FORMAT, "%s: \"__metadata__\" must be an object of strings", f->what);
    size_t n = 0;
    for (const cJSON *c = meta->child; c; c = c->next) n++;
    if (n == 0) return AT_OK;
    f->meta_keys = calloc(n, sizeof *f->meta_keys);
    f->meta_vals = calloc(n, sizeof *f->meta_vals);
    if (!f->meta_keys || !f->meta_vals) return at_error(AT_ERR_NOMEM, "%s: out of memory", f->what);
    for (const cJSON *c = meta->child; c; c = c->next) {
        if (!cJSON_IsString(c) || !c->valuestring)
            return at_error(AT_ERR_FORMAT, "%s: \"__metadata__\" value of \"%s\" is not a string", f->what,
                            c->string ? c->string : "");
        f->meta_keys[f->n_meta] = strdup(c->string ? c->string : "");
        f->meta_vals[f->n_meta] = strdup(c->valuestring);
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_vals[f->n_meta - 1])
            return at_error(AT_ERR_NOMEM, "%s: out of memory", f->what);
    }
    const char *dup = find_duplicate((const char **)f->meta_keys, f->n_meta);
    if (dup) return at_error(AT_ERR_FORMAT, "%s: \"__metadata__\" has key \"%s\" twice", f->what, dup);
    return AT_OK;
}

static at_status parse_entry(at_st_file *f, const cJSON *e, at_st_info *info)
{
    const char *name = e->string ? e->string : "";
    if (!cJSON_IsObject(e)) return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": entry is not an object", f->what, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!dt) return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": missing \"dtype\"", f->what, name);
    if (!sh) return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": missing \"shape\"", f->what, name);
    if (!off) return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": missing \"data_offsets\"", f->what, name);
    if (!cJSON_IsString(dt) || !dt->valuestring)
        return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": \"dtype\" is not a string", f->what, name);
    int di = st_dtype_lookup(dt->valuestring);
    if (di < 0)
        return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%.32s\"", f->what, name, dt->valuestring);
    info->dtype_name = st_dtypes[di].name;
    info->has_dtype = st_dtypes[di].has;
    info->dtype = st_dtypes[di].dtype;
    info->elem_size = st_dtypes[di].size;

    if (!cJSON_IsArray(sh))
        return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": \"shape\" is not an array", f->what, name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > AT_ST_MAX_DIMS)
        return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": %d dimensions (at most %d)", f->what, name, nd,
                        AT_ST_MAX_DIMS);
    info->ndim = nd;
    for (int i = 0; i < AT_ST_MAX_DIMS; i++) info->shape[i] = 1;
    uint64_t numel = 1, span = 1;
    int k = 0;
    for (const cJSON *d = sh->child; d; d = d->next, k++) {
        uint64_t v;
        if (!json_uint(d, &v))
            return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", f->what,
                            name, k);
        info->shape[k] = (int64_t)v;
        /* Also bound the product of the non-zero dims: consumers multiply the
         * dims of an empty tensor in any order. */
        if (__builtin_mul_overflow(numel, v, &numel) || __builtin_mul_overflow(span, v ? v : 1, &span) ||
            span > ((uint64_t)1 << 62))
            return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": shape overflows", f->what, name);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)info->elem_size, &nbytes))
        return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": shape overflows", f->what, name);

    uint64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(off->child, &b) ||
        !json_uint(off->child->next, &en))
        return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": \"data_offsets\" must be two non-negative integers",
                        f->what, name);
    if (en < b)
        return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin",
                        f->what, name, (unsigned long long)b, (unsigned long long)en);
    if (en > f->data_size)
        return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%llu, %llu] lie outside the data area (%zu bytes)",
                        f->what, name, (unsigned long long)b, (unsigned long long)en, f->data_size);
    if (en - b != nbytes) {
        char s[160];
        shape_str(s, sizeof s, nd, info->shape);
        return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\": shape %s of %s needs %llu bytes but data_offsets span %llu",
                        f->what, name, s, info->dtype_name, (unsigned long long)nbytes,
                        (unsigned long long)(en - b));
    }
    info->data = f->data_area + b;
    info->nbytes = (size_t)nbytes;
    return AT_OK;
}

at_status at_st_parse(const void *data, size_t size, const char *what, at_st_file **out)
{
    *out = NULL;
    at_status st = AT_OK;
    cJSON *root = NULL;
    const uint8_t *bytes = data;
    if (!what) what = "safetensors";
    at_st_file *f = calloc(1, sizeof *f);
    if (!f) return at_error(AT_ERR_NOMEM, "%s: out of memory", what);
    f->map.fd = -1;
    f->what = strdup(what);
    if (!f->what) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", what);
        goto done;
    }
    f->bytes = bytes;
    f->size = size;
    if (size < 8) {
        st = at_error(AT_ERR_FORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length", what, size);
        goto done;
    }
    uint64_t hlen = rd_u64(bytes);
    if (hlen > AT_ST_MAX_HEADER) {
        st = at_error(AT_ERR_FORMAT, "%s: header length %llu is absurd (more than %u bytes)", what,
                      (unsigned long long)hlen, AT_ST_MAX_HEADER);
        goto done;
    }
    if (hlen > size - 8) {
        st = at_error(AT_ERR_FORMAT, "%s: header length %llu exceeds the file (%zu bytes)", what,
                      (unsigned long long)hlen, size);
        goto done;
    }
    f->data_area = bytes + 8 + hlen;
    f->data_size = size - 8 - (size_t)hlen;
    AT_CHECK(at_json_parse((const char *)bytes + 8, (size_t)hlen, what, &root));
    if (!cJSON_IsObject(root)) {
        st = at_error(AT_ERR_FORMAT, "%s: header is not a JSON object", what);
        goto done;
    }
    size_t n = 0;
    for (const cJSON *c = root->child; c; c = c->next)
        if (!c->string || strcmp(c->string, "__metadata__") != 0) n++;
    f->infos = calloc(n ? n : 1, sizeof *f->infos);
    f->names = calloc(n ? n : 1, sizeof *f->names);
    f->by_name = calloc(n ? n : 1, sizeof *f->by_name);
    if (!f->infos || !f->names || !f->by_name) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory for %zu tensors", what, n);
        goto done;
    }
    int seen_meta = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c->string && strcmp(c->string, "__metadata__") == 0) {
            if (seen_meta) {
                st = at_error(AT_ERR_FORMAT, "%s: \"__metadata__\" appears twice", what);
                goto done;
            }
            seen_meta = 1;
            AT_CHECK(parse_metadata(f, c));
            continue;
        }
        at_st_info *info = &f->infos[f->n];
        AT_CHECK(parse_entry(f, c, info));
        f->names[f->n] = strdup(c->string ? c->string : "");
        if (!f->names[f->n]) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory", what);
            goto done;
        }
        info->name = f->names[f->n];
        f->n++;
    }
    /* cJSON keeps duplicate keys; a second "x" would shadow or alias the first. */
    const char *dup = find_duplicate((const char **)f->names, f->n);
    if (dup) {
        st = at_error(AT_ERR_FORMAT, "%s: tensor \"%s\" appears twice in the header", what, dup);
        goto done;
    }
    /* Overlaps show up between neighbours once sorted by offset. */
    qsort(f->infos, f->n, sizeof *f->infos, cmp_info_offset);
    const at_st_info *prev = NULL;
    for (size_t i = 0; i < f->n; i++) {
        const at_st_info *cur = &f->infos[i];
        if (cur->nbytes == 0) continue;
        if (prev && cur->data < prev->data + prev->nbytes) {
            st = at_error(AT_ERR_FORMAT, "%s: tensors \"%s\" and \"%s\" overlap in the data area", what, prev->name,
                          cur->name);
            goto done;
        }
        prev = cur;
    }
    for (size_t i = 0; i < f->n; i++) f->by_name[i] = &f->infos[i];
    qsort(f->by_name, f->n, sizeof *f->by_name, cmp_info_name);
done:
    cJSON_Delete(root);
    if (st != AT_OK) {
        at_st_close(f);
        return st;
    }
    *out = f;
    return AT_OK;
}

at_status at_st_open(const char *path, at_st_file **out)
{
    *out = NULL;
    at_mapped_file m;
    AT_TRY(at_map_file(path, &m));
    at_status st = at_st_parse(m.data, m.size, path, out);
    if (st != AT_OK) {
        at_unmap_file(&m);
        return st;
    }
    (*out)->map = m;
    (*out)->mapped = 1;
    return AT_OK;
}

void at_st_close(at_st_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free(f->names[i]);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->names);
    free(f->infos);
    free(f->by_name);
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->what);
    if (f->mapped) at_unmap_file(&f->map);
    free(f);
}

size_t at_st_count(const at_st_file *f) { return f->n; }
const at_st_info *at_st_info_at(const at_st_file *f, size_t i) { return i < f->n ? &f->infos[i] : NULL; }

static const at_st_info *find_in(const at_st_info *const *by_name, size_t n, const char *name)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(by_name[mid]->name, name);
        if (c == 0) return by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const at_st_info *at_st_find(const at_st_file *f, const char *name) { return find_in(f->by_name, f->n, name); }

size_t at_st_metadata_count(const at_st_file *f) { return f->n_meta; }

void at_st_metadata_at(const at_st_file *f, size_t i, const char **key, const char **value)
{
    *key = i < f->n_meta ? f->meta_keys[i] : NULL;
    *value = i < f->n_meta ? f->meta_vals[i] : NULL;
}

const char *at_st_metadata(const at_st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_vals[i];
    return NULL;
}

const uint8_t *at_st_bytes(const at_st_file *f, size_t *size)
{
    if (size) *size = f->size;
    return f->bytes;
}

/* ---- tensors ------------------------------------------------------------ */

static float load_float(const uint8_t *p, at_dtype t)
{
    if (t == AT_F32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return t == AT_BF16 ? at_bf16_to_f32(h) : at_f16_to_f32(h);
}

static void store_float(uint8_t *p, at_dtype t, float v)
{
    if (t == AT_F32) {
        memcpy(p, &v, 4);
        return;
    }
    uint16_t h = t == AT_BF16 ? at_f32_to_bf16(v) : at_f32_to_f16(v);
    memcpy(p, &h, 2);
}

static int is_float(at_dtype t) { return t == AT_F32 || t == AT_BF16 || t == AT_F16; }

at_status at_st_read_f32(const at_st_info *info, float *dst, size_t n)
{
    if (!info->has_dtype || !is_float(info->dtype))
        return at_error(AT_ERR_UNSUPPORTED, "tensor %s is stored as %s (F32, BF16 or F16 are read)", info->name,
                        info->dtype_name);
    if (info->nbytes != n * info->elem_size)
        return at_error(AT_ERR_FORMAT, "tensor %s holds %zu bytes, not %zu values", info->name, info->nbytes, n);
    for (size_t i = 0; i < n; i++) dst[i] = load_float(info->data + i * info->elem_size, info->dtype);
    return AT_OK;
}

at_status at_st_tensor(const at_st_info *info, at_dtype want, at_tensor **out)
{
    *out = NULL;
    char s[160];
    if (!info->has_dtype)
        return at_error(AT_ERR_UNSUPPORTED, "tensor %s: stored dtype %s is not supported", info->name,
                        info->dtype_name);
    if (info->ndim > AT_MAX_DIMS) {
        shape_str(s, sizeof s, info->ndim, info->shape);
        return at_error(AT_ERR_UNSUPPORTED, "tensor %s: shape %s has more than %d dimensions", info->name, s,
                        AT_MAX_DIMS);
    }
    int ndim = info->ndim ? info->ndim : 1;
    int64_t shape[AT_MAX_DIMS] = {1, 1, 1, 1};
    for (int i = 0; i < info->ndim; i++) shape[i] = info->shape[i];
    if (want == AT_ST_KEEP_DTYPE) want = info->dtype;
    if (want == info->dtype && ((uintptr_t)info->data % info->elem_size) == 0)
        return at_tensor_wrap((void *)info->data, want, ndim, shape, info->name, out);
    if (!(want == info->dtype || (is_float(want) && is_float(info->dtype))))
        return at_error(AT_ERR_UNSUPPORTED, "tensor %s: cannot convert %s to %s", info->name, info->dtype_name,
                        at_dtype_name(want));
    at_tensor *t = NULL;
    AT_TRY(at_tensor_new(at_cpu_backend(), want, ndim, shape, info->name, &t));
    uint8_t *dst = at_tensor_data(t);
    size_t n = info->nbytes / info->elem_size;
    if (want == info->dtype) {
        memcpy(dst, info->data, info->nbytes); /* unaligned source */
    } else {
        size_t ds = at_dtype_block_bytes(want);
        for (size_t i = 0; i < n; i++) store_float(dst + i * ds, want, load_float(info->data + i * info->elem_size, info->dtype));
    }
    *out = t;
    return AT_OK;
}

/* ---- models: one file or a sharded folder -------------------------------- */

struct at_st_model {
    at_st_file **shards;
    size_t n_shards;
    const at_st_info **all;     /* shard by shard */
    const at_st_info **by_name; /* sorted by name */
    size_t n;
    char *what;
};

void at_st_model_close(at_st_model *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n_shards; i++) at_st_close(m->shards[i]);
    free(m->shards);
    free(m->all);
    free(m->by_name);
    free(m->what);
    free(m);
}

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Builds the name index over all shards; a name in two shards is an error. */
static at_status model_index(at_st_model *m)
{
    size_t n = 0;
    for (size_t s = 0; s < m->n_shards; s++) n += at_st_count(m->shards[s]);
    m->all = calloc(n ? n : 1, sizeof *m->all);
    m->by_name = calloc(n ? n : 1, sizeof *m->by_name);
    if (!m->all || !m->by_name) return at_error(AT_ERR_NOMEM, "%s: out of memory", m->what);
    for (size_t s = 0; s < m->n_shards; s++) {
        at_st_file *f = m->shards[s];
        for (size_t i = 0; i < f->n; i++) {
            f->infos[i].shard = (int)s;
            m->all[m->n] = &f->infos[i];
            m->by_name[m->n] = &f->infos[i];
            m->n++;
        }
    }
    qsort(m->by_name, m->n, sizeof *m->by_name, cmp_info_name);
    for (size_t i = 1; i < m->n; i++)
        if (strcmp(m->by_name[i - 1]->name, m->by_name[i]->name) == 0)
            return at_error(AT_ERR_FORMAT, "%s: tensor \"%s\" is in two shards (%s and %s)", m->what,
                            m->by_name[i]->name, m->shards[m->by_name[i - 1]->shard]->what,
                            m->shards[m->by_name[i]->shard]->what);
    return AT_OK;
}

static at_status model_add_shard(at_st_model *m, const char *path)
{
    at_st_file **ns = realloc(m->shards, (m->n_shards + 1) * sizeof *ns);
    if (!ns) return at_error(AT_ERR_NOMEM, "%s: out of memory", m->what);
    m->shards = ns;
    AT_TRY(at_st_open(path, &m->shards[m->n_shards]));
    m->n_shards++;
    return AT_OK;
}

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    size_t n = (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

static at_status open_index(at_st_model *m, const char *index_path)
{
    at_status st = AT_OK;
    cJSON *root = NULL;
    const char **files = NULL;
    size_t n_files = 0, n_entries = 0;
    char *dir = dir_of(index_path);
    if (!dir) return at_error(AT_ERR_NOMEM, "out of memory");
    AT_CHECK(at_json_parse_file(index_path, &root));
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(wm)) {
        st = at_error(AT_ERR_FORMAT, "%s: no \"weight_map\" object", index_path);
        goto done;
    }
    for (const cJSON *c = wm->child; c; c = c->next) n_entries++;
    files = calloc(n_entries ? n_entries : 1, sizeof *files);
    if (!files) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    for (const cJSON *c = wm->child; c; c = c->next) {
        const char *fn = cJSON_IsString(c) ? c->valuestring : NULL;
        /* Shard names are plain file names beside the index: no paths out of the folder. */
        if (!fn || !*fn || strchr(fn, '/') || strcmp(fn, "..") == 0 || strcmp(fn, ".") == 0) {
            st = at_error(AT_ERR_FORMAT, "%s: weight_map entry \"%s\" is not a file name in the folder", index_path,
                          c->string ? c->string : "");
            goto done;
        }
        files[n_files++] = fn;
    }
    {
        const char **names = calloc(n_entries ? n_entries : 1, sizeof *names);
        if (!names) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory", index_path);
            goto done;
        }
        size_t k = 0;
        for (const cJSON *c = wm->child; c; c = c->next) names[k++] = c->string ? c->string : "";
        const char *dup = find_duplicate(names, k);
        if (dup) st = at_error(AT_ERR_FORMAT, "%s: weight_map has \"%s\" twice", index_path, dup);
        free(names);
        if (st != AT_OK) goto done;
    }
    qsort(files, n_files, sizeof *files, cmp_str_ptr);
    for (size_t i = 0; i < n_files; i++) {
        if (i > 0 && strcmp(files[i], files[i - 1]) == 0) continue;
        char *p = at_path_join(dir, files[i]);
        if (!p) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        st = model_add_shard(m, p);
        free(p);
        if (st != AT_OK) {
            at_error_wrap(st, "%s", index_path);
            goto done;
        }
    }
    AT_CHECK(model_index(m));
    for (const cJSON *c = wm->child; c; c = c->next) {
        const at_st_info *info = find_in(m->by_name, m->n, c->string ? c->string : "");
        if (!info || strcmp(strrchr(m->shards[info->shard]->what, '/') ? strrchr(m->shards[info->shard]->what, '/') + 1
                                                                        : m->shards[info->shard]->what,
                            c->valuestring) != 0) {
            st = at_error(AT_ERR_FORMAT, "%s: weight_map puts \"%s\" in %s, but that shard does not hold it",
                          index_path, c->string ? c->string : "", c->valuestring);
            goto done;
        }
    }
done:
    free(files);
    free(dir);
    cJSON_Delete(root);
    return st;
}

/* A folder without an index: model.safetensors, else the only *.safetensors. */
static at_status open_folder(at_st_model *m, const char *dir)
{
    char *p = at_path_join(dir, "model.safetensors");
    if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
    if (at_file_exists(p)) {
        at_status st = model_add_shard(m, p);
        free(p);
        return st;
    }
    free(p);
    DIR *d = opendir(dir);
    if (!d) return at_error(AT_ERR_IO, "%s: cannot open folder: %s", dir, strerror(errno));
    char *found = NULL;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !has_suffix(e->d_name, ".safetensors")) continue;
        count++;
        if (!found) found = strdup(e->d_name);
    }
    closedir(d);
    at_status st;
    if (count == 0) {
        st = at_error(AT_ERR_NOT_FOUND, "%s: no model.safetensors, model.safetensors.index.json or *.safetensors",
                      dir);
    } else if (count > 1) {
        st = at_error(AT_ERR_FORMAT, "%s: %d *.safetensors files but no model.safetensors.index.json to say which "
                      "tensors each holds", dir, count);
    } else if (!found) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
    } else {
        p = at_path_join(dir, found);
        st = p ? model_add_shard(m, p) : at_error(AT_ERR_NOMEM, "out of memory");
        free(p);
    }
    free(found);
    return st;
}

at_status at_st_model_open(const char *path, at_st_model **out)
{
    *out = NULL;
    at_status st = AT_OK;
    at_st_model *m = calloc(1, sizeof *m);
    if (!m || !(m->what = strdup(path))) {
        free(m);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    if (at_is_dir(path)) {
        char *idx = at_path_join(path, "model.safetensors.index.json");
        if (!idx) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (at_file_exists(idx)) st = open_index(m, idx);
        else st = open_folder(m, path);
        free(idx);
        if (st != AT_OK) goto done;
        if (m->all == NULL) AT_CHECK(model_index(m));
    } else if (has_suffix(path, ".index.json")) {
        AT_CHECK(open_index(m, path));
    } else {
        AT_CHECK(model_add_shard(m, path));
        AT_CHECK(model_index(m));
    }
done:
    if (st != AT_OK) {
        at_st_model_close(m);
        return st;
    }
    *out = m;
    return AT_OK;
}

size_t at_st_model_count(const at_st_model *m) { return m->n; }
const at_st_info *at_st_model_info_at(const at_st_model *m, size_t i) { return i < m->n ? m->all[i] : NULL; }
const at_st_info *at_st_model_find(const at_st_model *m, const char *name) { return find_in(m->by_name, m->n, name); }
size_t at_st_model_shard_count(const at_st_model *m) { return m->n_shards; }
const at_st_file *at_st_model_shard(const at_st_model *m, size_t i) { return i < m->n_shards ? m->shards[i] : NULL; }

at_status at_st_get(const at_st_model *m, const char *name, int ndim, const int64_t *expected_shape,
                    at_dtype want_dtype, at_tensor **out)
{
    *out = NULL;
    char want[160] = "any shape", got[160];
    if (expected_shape) shape_str(want, sizeof want, ndim, expected_shape);
    const at_st_info *info = at_st_model_find(m, name);
    if (!info)
        return at_error(AT_ERR_NOT_FOUND, "%s: tensor %s (expected shape %s) is missing", m->what, name, want);
    if (expected_shape) {
        int ok = info->ndim == ndim;
        for (int i = 0; ok && i < ndim; i++) ok = info->shape[i] == expected_shape[i];
        if (!ok) {
            shape_str(got, sizeof got, info->ndim, info->shape);
            return at_error(AT_ERR_FORMAT, "%s: tensor %s has shape %s, expected %s", m->shards[info->shard]->what,
                            name, got, want);
        }
    }
    at_status st = at_st_tensor(info, want_dtype, out);
    if (st != AT_OK) at_error_wrap(st, "%s", m->shards[info->shard]->what);
    return st;
}

/* ---- writing ------------------------------------------------------------ */

at_status at_safetensors_write(const char *path, const at_tensor *const *tensors, const char *const *names,
                               size_t n, const at_st_kv *metadata, size_t n_meta)
{
    return at_safetensors_write_shaped(path, tensors, names, NULL, n, metadata, n_meta);
}

at_status at_safetensors_write_shaped(const char *path, const at_tensor *const *tensors, const char *const *names,
                                      const at_st_shape *shapes, size_t n, const at_st_kv *metadata, size_t n_meta)
{
    at_status st = AT_OK;
    cJSON *root = NULL;
    char *hdr = NULL;
    size_t *order = NULL;
    const char **nm = NULL;
    uint8_t *tmpbuf = NULL;
    at_atomic_file ao = {.fd = -1};

    order = malloc((n ? n : 1) * sizeof *order);
    nm = malloc((n ? n : 1) * sizeof *nm);
    root = cJSON_CreateObject();
    if (!order || !nm || !root) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        nm[i] = names ? names[i] : tensors[i]->name;
        if (!st_dtype_of(tensors[i]->dtype)) {
            st = at_error(AT_ERR_UNSUPPORTED, "%s: tensor %s: dtype %s cannot be stored in safetensors", path, nm[i],
                          at_dtype_name(tensors[i]->dtype));
            goto done;
        }
        if (shapes && shapes[i].ndim > 0) {
            int64_t ne = 1;
            for (int d = 0; d < shapes[i].ndim && d < AT_ST_MAX_DIMS; d++) ne *= shapes[i].shape[d];
            if (shapes[i].ndim > AT_ST_MAX_DIMS || ne != at_tensor_numel(tensors[i])) {
                st = at_error(AT_ERR_INVALID, "%s: tensor %s: the shape to write does not hold its %lld elements", path,
                              nm[i], (long long)at_tensor_numel(tensors[i]));
                goto done;
            }
        }
        if (strcmp(nm[i], "__metadata__") == 0) {
            st = at_error(AT_ERR_INVALID, "%s: \"__metadata__\" is not a tensor name", path);
            goto done;
        }
    }
    const char *dup = find_duplicate(nm, n);
    if (dup) {
        st = at_error(AT_ERR_INVALID, "%s: tensor name \"%s\" given twice", path, dup);
        goto done;
    }
    /* Wider elements first (stable), so with contiguous spans every tensor is
     * aligned for its type, as the safetensors library itself arranges it. */
    size_t k = 0;
    for (size_t w = 8; w >= 1; w /= 2)
        for (size_t i = 0; i < n; i++)
            if (at_dtype_block_bytes(tensors[i]->dtype) == w) order[k++] = i;
    if (k != n) {
        st = at_error(AT_ERR_INTERNAL, "%s: element sizes", path);
        goto done;
    }
    if (n_meta > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        if (!meta) {
            st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (size_t i = 0; i < n_meta; i++) {
            if (cJSON_GetObjectItemCaseSensitive(meta, metadata[i].key)) {
                st = at_error(AT_ERR_INVALID, "%s: metadata key \"%s\" given twice", path, metadata[i].key);
                goto done;
            }
            if (!cJSON_AddStringToObject(meta, metadata[i].key, metadata[i].value)) {
                st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
        }
    }
    uint64_t off = 0;
    for (size_t j = 0; j < n; j++) {
        const at_tensor *t = tensors[order[j]];
        size_t nb = at_tensor_nbytes(t);
        cJSON *e = cJSON_AddObjectToObject(root, nm[order[j]]);
        cJSON *shape = cJSON_CreateArray();
        cJSON *offs = cJSON_CreateArray();
        if (!e || !shape || !offs) {
            cJSON_Delete(shape);
            cJSON_Delete(offs);
            st = at_error(AT_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        cJSON_AddStringToObject(e, "dtype", st_dtype_of(t->dtype));
        cJSON_AddItemToObject(e, "shape", shape);
        cJSON_AddItemToObject(e, "data_offsets", offs);
        const at_st_shape *fs = shapes && shapes[order[j]].ndim > 0 ? &shapes[order[j]] : NULL;
        for (int d = 0; d < (fs ? fs->ndim : t->ndim); d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)(fs ? fs->shape[d] : t->shape[d])));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + nb)));
        off += nb;
    }
    hdr = cJSON_PrintUnformatted(root);
    if (!hdr) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory printing the header", path);
        goto done;
    }
    size_t hl = strlen(hdr);
    size_t padded = (hl + 7) / 8 * 8;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    AT_CHECK(at_atomic_open(&ao, path));
    AT_CHECK(at_atomic_write(&ao, len8, 8));
    AT_CHECK(at_atomic_write(&ao, hdr, hl));
    AT_CHECK(at_atomic_write(&ao, "        ", padded - hl));
    for (size_t j = 0; j < n; j++) {
        const at_tensor *t = tensors[order[j]];
        size_t nb = at_tensor_nbytes(t);
        const void *src = at_tensor_data(t);
        if (!src && nb > 0) { /* device tensor: bring it to the host first */
            free(tmpbuf);
            tmpbuf = malloc(nb);
            if (!tmpbuf) {
                st = at_error(AT_ERR_NOMEM, "%s: tensor %s: out of memory (%zu bytes)", path, nm[order[j]], nb);
                goto done;
            }
            AT_CHECK(at_tensor_download(t, tmpbuf, nb));
            src = tmpbuf;
        }
        if (nb > 0) AT_CHECK(at_atomic_write(&ao, src, nb));
    }
    st = at_atomic_commit(&ao);
done:
    if (st != AT_OK) at_atomic_abort(&ao);
    free(tmpbuf);
    free(hdr);
    free(order);
    free(nm);
    cJSON_Delete(root);
    return st;
}
