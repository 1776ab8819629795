#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "device/cpu/cpu_backend.h"

/* The format is little-endian; so are the hosts this project builds for. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c assumes a little-endian host"
#endif

/* ---- types -------------------------------------------------------------- */

typedef struct {
    uint32_t id;
    const char *name;
    size_t blk;   /* elements per block */
    size_t bytes; /* bytes per block */
} ggml_traits;

/* Block sizes from ggml's type_traits (ggml.c / ggml-common.h). */
static const ggml_traits ggml_types[] = {
    {AT_GGML_F32, "F32", 1, 4},        {AT_GGML_F16, "F16", 1, 2},        {AT_GGML_Q4_0, "Q4_0", 32, 18},
    {AT_GGML_Q4_1, "Q4_1", 32, 20},    {AT_GGML_Q5_0, "Q5_0", 32, 22},    {AT_GGML_Q5_1, "Q5_1", 32, 24},
    {AT_GGML_Q8_0, "Q8_0", 32, 34},    {AT_GGML_Q8_1, "Q8_1", 32, 36},    {AT_GGML_Q2_K, "Q2_K", 256, 84},
    {AT_GGML_Q3_K, "Q3_K", 256, 110},  {AT_GGML_Q4_K, "Q4_K", 256, 144},  {AT_GGML_Q5_K, "Q5_K", 256, 176},
    {AT_GGML_Q6_K, "Q6_K", 256, 210},  {AT_GGML_Q8_K, "Q8_K", 256, 292},  {AT_GGML_IQ4_NL, "IQ4_NL", 32, 18},
    {AT_GGML_IQ4_XS, "IQ4_XS", 256, 136}, {AT_GGML_I8, "I8", 1, 1},      {AT_GGML_I16, "I16", 1, 2},
    {AT_GGML_I32, "I32", 1, 4},        {AT_GGML_I64, "I64", 1, 8},        {AT_GGML_F64, "F64", 1, 8},
    {AT_GGML_BF16, "BF16", 1, 2},
};

static const ggml_traits *traits_of(uint32_t type)
{
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
        if (ggml_types[i].id == type) return &ggml_types[i];
    return NULL;
}

const char *at_ggml_type_name(uint32_t type)
{
    const ggml_traits *t = traits_of(type);
    return t ? t->name : "?";
}
size_t at_ggml_block_elems(uint32_t type)
{
    const ggml_traits *t = traits_of(type);
    return t ? t->blk : 0;
}
size_t at_ggml_block_bytes(uint32_t type)
{
    const ggml_traits *t = traits_of(type);
    return t ? t->bytes : 0;
}

int at_ggml_from_dtype(at_dtype t)
{
    switch (t) {
    case AT_F32: return AT_GGML_F32;
    case AT_F16: return AT_GGML_F16;
    case AT_BF16: return AT_GGML_BF16;
    case AT_Q8_0: return AT_GGML_Q8_0;
    case AT_Q4_0: return AT_GGML_Q4_0;
    case AT_I32: return AT_GGML_I32;
    default: return -1;
    }
}

int at_ggml_to_dtype(uint32_t type)
{
    switch (type) {
    case AT_GGML_F32: return AT_F32;
    case AT_GGML_F16: return AT_F16;
    case AT_GGML_BF16: return AT_BF16;
    case AT_GGML_Q8_0: return AT_Q8_0;
    case AT_GGML_Q4_0: return AT_Q4_0;
    case AT_GGML_I32: return AT_I32;
    default: return -1;
    }
}

static const char *const type_names[AT_GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64"};

const char *at_gguf_type_name(at_gguf_type t) { return (unsigned)t < AT_GGUF_TYPE_COUNT ? type_names[t] : "?"; }

/* Bytes of a scalar type; 0 for string, array and unknown types. */
static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case AT_GGUF_UINT8: case AT_GGUF_INT8: case AT_GGUF_BOOL: return 1;
    case AT_GGUF_UINT16: case AT_GGUF_INT16: return 2;
    case AT_GGUF_UINT32: case AT_GGUF_INT32: case AT_GGUF_FLOAT32: return 4;
    case AT_GGUF_UINT64: case AT_GGUF_INT64: case AT_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Decodes one scalar of type t at p (unaligned). */
static void decode_scalar(uint32_t t, const uint8_t *p, at_gguf_value *out)
{
    memset(out, 0, sizeof *out);
    out->type = (at_gguf_type)t;
    switch (t) {
    case AT_GGUF_UINT8: out->v.u = p[0]; break;
    case AT_GGUF_INT8: out->v.i = (int8_t)p[0]; break;
    case AT_GGUF_BOOL: out->v.b = p[0] != 0; break;
    case AT_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); out->v.u = x; break; }
    case AT_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); out->v.i = x; break; }
    case AT_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); out->v.u = x; break; }
    case AT_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); out->v.i = x; break; }
    case AT_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); out->v.f = x; break; }
    case AT_GGUF_UINT64: { uint64_t x; memcpy(&x, p, 8); out->v.u = x; break; }
    case AT_GGUF_INT64: { int64_t x; memcpy(&x, p, 8); out->v.i = x; break; }
    case AT_GGUF_FLOAT64: { double x; memcpy(&x, p, 8); out->v.f = x; break; }
    default: break;
    }
}

at_status at_gguf_value_elem(const at_gguf_value *arr, size_t i, at_gguf_value *out)
{
    if (!arr || arr->type != AT_GGUF_ARRAY || i >= arr->v.arr.count)
        return at_error(AT_ERR_INVALID, "gguf: array element %zu out of range", i);
    size_t es = scalar_size(arr->v.arr.type);
    if (es) decode_scalar(arr->v.arr.type, arr->v.arr.raw + i * es, out);
    else *out = arr->v.arr.items[i];
    return AT_OK;
}

static int is_uint_type(at_gguf_type t)
{
    return t == AT_GGUF_UINT8 || t == AT_GGUF_UINT16 || t == AT_GGUF_UINT32 || t == AT_GGUF_UINT64;
}
static int is_int_type(at_gguf_type t)
{
    return t == AT_GGUF_INT8 || t == AT_GGUF_INT16 || t == AT_GGUF_INT32 || t == AT_GGUF_INT64;
}

at_status at_gguf_value_int(const at_gguf_value *v, int64_t *out)
{
    if (is_int_type(v->type)) *out = v->v.i;
    else if (is_uint_type(v->type) && v->v.u <= (uint64_t)INT64_MAX) *out = (int64_t)v->v.u;
    else return AT_ERR_FORMAT;
    return AT_OK;
}

at_status at_gguf_value_uint(const at_gguf_value *v, uint64_t *out)
{
    if (is_uint_type(v->type)) *out = v->v.u;
    else if (is_int_type(v->type) && v->v.i >= 0) *out = (uint64_t)v->v.i;
    else return AT_ERR_FORMAT;
    return AT_OK;
}

at_status at_gguf_value_float(const at_gguf_value *v, double *out)
{
    if (v->type == AT_GGUF_FLOAT32 || v->type == AT_GGUF_FLOAT64) *out = v->v.f;
    else if (is_int_type(v->type)) *out = (double)v->v.i;
    else if (is_uint_type(v->type)) *out = (double)v->v.u;
    else return AT_ERR_FORMAT;
    return AT_OK;
}

/* ---- arena: all strings and item arrays of a file live here -------------- */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    _Alignas(16) uint8_t data[];
} arena_chunk;

typedef struct {
    arena_chunk *head;
} arena;

static void *arena_alloc(arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        arena_chunk *c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(arena *a)
{
    while (a->head) {
        arena_chunk *n = a->head->next;
        free(a->head);
        a->head = n;
    }
}

/* ---- reading ------------------------------------------------------------ */

typedef struct {
    char *key;
    at_gguf_value value;
} gguf_kv;

struct at_gguf {
    at_mapped_file map;
    int mapped;
    const uint8_t *bytes;
    size_t size;
    char *what;
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    arena ar;
    gguf_kv *kv;
    size_t n_kv;
    gguf_kv **kv_by_key; /* sorted by key */
    at_gguf_tensor_info *tensors;
    size_t n_tensors;
    const at_gguf_tensor_info **tensor_by_name; /* sorted by name */
};

typedef struct {
    const uint8_t *p, *end;
    const char *what;
    arena *ar;
} reader;

static size_t left(const reader *r) { return (size_t)(r->end - r->p); }

static at_status rd_bytes(reader *r, void *out, size_t n, const char *ctx)
{
    if (left(r) < n)
        return at_error(AT_ERR_FORMAT, "%s: truncated at byte %zu reading %s", r->what,
                        (size_t)(r->end - r->p), ctx);
    memcpy(out, r->p, n);
    r->p += n;
    return AT_OK;
}

static at_status rd_u32(reader *r, uint32_t *v, const char *ctx) { return rd_bytes(r, v, 4, ctx); }
static at_status rd_u64(reader *r, uint64_t *v, const char *ctx) { return rd_bytes(r, v, 8, ctx); }

/* A string copied into the arena with a NUL after it. */
static at_status rd_string(reader *r, const char **s, size_t *len, const char *ctx)
{
    uint64_t n = 0;
    AT_TRY(rd_u64(r, &n, ctx));
    if (n > left(r))
        return at_error(AT_ERR_FORMAT, "%s: %s: string length %llu runs past the end of the file", r->what, ctx,
                        (unsigned long long)n);
    char *d = arena_alloc(r->ar, (size_t)n + 1);
    if (!d) return at_error(AT_ERR_NOMEM, "%s: out of memory", r->what);
    memcpy(d, r->p, (size_t)n);
    d[n] = '\0';
    r->p += n;
    *s = d;
    *len = (size_t)n;
    return AT_OK;
}

static at_status rd_value(reader *r, uint32_t type, int depth, at_gguf_value *out, const char *key)
{
    memset(out, 0, sizeof *out);
    out->type = (at_gguf_type)type;
    size_t ss = scalar_size(type);
    if (ss) {
        if (left(r) < ss) return at_error(AT_ERR_FORMAT, "%s: key %s: value runs past the end of the file", r->what, key);
        decode_scalar(type, r->p, out);
        r->p += ss;
        return AT_OK;
    }
    if (type == AT_GGUF_STRING) return rd_string(r, &out->v.str.s, &out->v.str.len, key);
    if (type != AT_GGUF_ARRAY) return at_error(AT_ERR_FORMAT, "%s: key %s: unknown value type %u", r->what, key, type);
    if (depth >= AT_GGUF_MAX_DEPTH)
        return at_error(AT_ERR_FORMAT, "%s: key %s: arrays nested deeper than %d", r->what, key, AT_GGUF_MAX_DEPTH);
    uint32_t et = 0;
    uint64_t count = 0;
    AT_TRY(rd_u32(r, &et, key));
    AT_TRY(rd_u64(r, &count, key));
    out->v.arr.type = (at_gguf_type)et;
    size_t es = scalar_size(et);
    if (es) {
        if (count > left(r) / es)
            return at_error(AT_ERR_FORMAT, "%s: key %s: array of %llu %s runs past the end of the file", r->what, key,
                            (unsigned long long)count, at_gguf_type_name((at_gguf_type)et));
        out->v.arr.count = (size_t)count;
        out->v.arr.raw = r->p;
        r->p += (size_t)count * es;
        return AT_OK;
    }
    if (et != AT_GGUF_STRING && et != AT_GGUF_ARRAY)
        return at_error(AT_ERR_FORMAT, "%s: key %s: array of unknown type %u", r->what, key, et);
    /* Each string element takes at least 8 bytes, each array 12: this bounds the
     * allocation by the file size, whatever the count claims. */
    size_t min = et == AT_GGUF_STRING ? 8 : 12;
    if (count > left(r) / min)
        return at_error(AT_ERR_FORMAT, "%s: key %s: array of %llu %s runs past the end of the file", r->what, key,
                        (unsigned long long)count, at_gguf_type_name((at_gguf_type)et));
    at_gguf_value *items = arena_alloc(r->ar, (size_t)count * sizeof *items + 1);
    if (!items) return at_error(AT_ERR_NOMEM, "%s: out of memory", r->what);
    for (size_t i = 0; i < count; i++) AT_TRY(rd_value(r, et, depth + 1, &items[i], key));
    out->v.arr.count = (size_t)count;
    out->v.arr.items = items;
    return AT_OK;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const at_gguf_tensor_info *const *)a)->name, (*(const at_gguf_tensor_info *const *)b)->name);
}
static int cmp_tensor_offset(const void *a, const void *b)
{
    uint64_t x = (*(const at_gguf_tensor_info *const *)a)->offset, y = (*(const at_gguf_tensor_info *const *)b)->offset;
    return x < y ? -1 : x > y;
}
static int cmp_key(const void *a, const void *b)
{
    return strcmp((*(const gguf_kv *const *)a)->key, (*(const gguf_kv *const *)b)->key);
}

static at_status read_tensor_info(reader *r, at_gguf *g, size_t i)
{
    at_gguf_tensor_info *t = &g->tensors[i];
    size_t len;
    char ctx[64];
    snprintf(ctx, sizeof ctx, "tensor info %zu", i);
    AT_TRY(rd_string(r, &t->name, &len, ctx));
    uint32_t nd = 0;
    AT_TRY(rd_u32(r, &nd, t->name));
    if (nd < 1 || nd > AT_GGUF_MAX_DIMS)
        return at_error(AT_ERR_FORMAT, "%s: tensor %s: %u dimensions (1 to %d allowed)", g->what, t->name, nd,
                        AT_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    for (int d = 0; d < AT_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t ne = 0;
        AT_TRY(rd_u64(r, &ne, t->name));
        if (ne > ((uint64_t)1 << 40))
            return at_error(AT_ERR_FORMAT, "%s: tensor %s: ne[%u] = %llu is absurd", g->what, t->name, d,
                            (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    /* Consumers multiply the dims in any order: the product of the non-zero ones
     * must fit even when another dim is 0 and the tensor is empty. */
    uint64_t span = 1;
    for (int d = 0; d < AT_GGUF_MAX_DIMS; d++)
        if (__builtin_mul_overflow(span, (uint64_t)(t->ne[d] ? t->ne[d] : 1), &span) || span > ((uint64_t)1 << 62))
            return at_error(AT_ERR_FORMAT, "%s: tensor %s: element count overflows", g->what, t->name);
    AT_TRY(rd_u32(r, &t->type, t->name));
    AT_TRY(rd_u64(r, &t->offset, t->name));
    const ggml_traits *tr = traits_of(t->type);
    if (!tr) return at_error(AT_ERR_FORMAT, "%s: tensor %s: unknown or unsupported ggml type %u", g->what, t->name, t->type);
    if (t->ne[0] % (int64_t)tr->blk != 0)
        return at_error(AT_ERR_FORMAT, "%s: tensor %s: row length %lld is not a multiple of the %s block (%zu)", g->what,
                        t->name, (long long)t->ne[0], tr->name, tr->blk);
    uint64_t nb = (uint64_t)t->ne[0] / tr->blk * tr->bytes;
    for (int d = 1; d < AT_GGUF_MAX_DIMS; d++)
        if (__builtin_mul_overflow(nb, (uint64_t)t->ne[d], &nb))
            return at_error(AT_ERR_FORMAT, "%s: tensor %s: size overflows", g->what, t->name);
    if (nb > SIZE_MAX) return at_error(AT_ERR_FORMAT, "%s: tensor %s: size overflows", g->what, t->name);
    t->nbytes = (size_t)nb;
    return AT_OK;
}

at_status at_gguf_parse(const void *data, size_t size, const char *what, at_gguf **out)
{
    *out = NULL;
    at_status st = AT_OK;
    gguf_kv **ks = NULL;
    const at_gguf_tensor_info **by_off = NULL;
    if (!what) what = "gguf";
    at_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->what = strdup(what))) {
        free(g);
        return at_error(AT_ERR_NOMEM, "%s: out of memory", what);
    }
    g->map.fd = -1;
    g->bytes = data;
    g->size = size;
    g->alignment = AT_GGUF_DEFAULT_ALIGNMENT;
    /* an empty file maps to NULL: no end pointer from it */
    reader r = {.p = data, .end = data ? (const uint8_t *)data + size : NULL, .what = g->what, .ar = &g->ar};
    if (size < 4 || memcmp(data, "GGUF", 4) != 0) {
        st = at_error(AT_ERR_FORMAT, "%s: not a GGUF file (bad magic)", what);
        goto done;
    }
    r.p += 4;
    uint64_t n_tensors = 0, n_kv = 0;
    AT_CHECK(rd_u32(&r, &g->version, "the version"));
    if (g->version != 2 && g->version != 3) {
        st = at_error(AT_ERR_FORMAT, "%s: GGUF version %u is not supported (2 and 3 are)", what, g->version);
        goto done;
    }
    AT_CHECK(rd_u64(&r, &n_tensors, "the tensor count"));
    AT_CHECK(rd_u64(&r, &n_kv, "the key count"));
    /* A key-value pair takes at least 8 + 4 + 1 bytes, a tensor info 8+4+8+4+8. */
    if (n_kv > left(&r) / 13 || n_tensors > left(&r) / 32) {
        st = at_error(AT_ERR_FORMAT, "%s: %llu keys and %llu tensors cannot fit in a %zu-byte file", what,
                      (unsigned long long)n_kv, (unsigned long long)n_tensors, size);
        goto done;
    }
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    g->tensor_by_name = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensor_by_name);
    ks = calloc(n_kv ? n_kv : 1, sizeof *ks);
    by_off = calloc(n_tensors ? n_tensors : 1, sizeof *by_off);
    if (!g->kv || !g->tensors || !g->tensor_by_name || !ks || !by_off) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", what);
        goto done;
    }
    for (size_t i = 0; i < n_kv; i++) {
        const char *key;
        size_t klen;
        char ctx[48];
        snprintf(ctx, sizeof ctx, "key %zu", i);
        AT_CHECK(rd_string(&r, &key, &klen, ctx));
        g->kv[i].key = (char *)key;
        uint32_t type = 0;
        AT_CHECK(rd_u32(&r, &type, key));
        AT_CHECK(rd_value(&r, type, 0, &g->kv[i].value, key));
        g->n_kv++;
        ks[i] = &g->kv[i];
    }
    qsort(ks, g->n_kv, sizeof *ks, cmp_key);
    g->kv_by_key = ks;
    ks = NULL;
    for (size_t i = 1; i < g->n_kv; i++)
        if (strcmp(g->kv_by_key[i - 1]->key, g->kv_by_key[i]->key) == 0) {
            st = at_error(AT_ERR_FORMAT, "%s: key %s appears twice", what, g->kv_by_key[i]->key);
            goto done;
        }
    const at_gguf_value *al = at_gguf_get(g, "general.alignment");
    if (al) {
        if (al->type != AT_GGUF_UINT32 || al->v.u == 0 || (al->v.u & (al->v.u - 1)) != 0) {
            st = at_error(AT_ERR_FORMAT, "%s: general.alignment must be a power of two stored as uint32", what);
            goto done;
        }
        g->alignment = (size_t)al->v.u;
    }
    for (size_t i = 0; i < n_tensors; i++) {
        AT_CHECK(read_tensor_info(&r, g, i));
        g->n_tensors++;
    }
    size_t pos = (size_t)(r.p - (const uint8_t *)data);
    size_t pad = (g->alignment - pos % g->alignment) % g->alignment;
    g->data_offset = pos + pad;
    for (size_t i = 0; i < g->n_tensors; i++) {
        at_gguf_tensor_info *t = &g->tensors[i];
        if (t->offset % g->alignment != 0) {
            st = at_error(AT_ERR_FORMAT, "%s: tensor %s: offset %llu is not a multiple of the alignment %zu", what,
                          t->name, (unsigned long long)t->offset, g->alignment);
            goto done;
        }
        if (g->data_offset > size || t->offset > size - g->data_offset ||
            t->nbytes > size - g->data_offset - t->offset) {
            st = at_error(AT_ERR_FORMAT, "%s: tensor %s: data [%llu, +%zu) lies outside the file (%zu bytes of data)",
                          what, t->name, (unsigned long long)t->offset, t->nbytes,
                          g->data_offset > size ? (size_t)0 : size - g->data_offset);
            goto done;
        }
        t->data = (const uint8_t *)data + g->data_offset + t->offset;
        g->tensor_by_name[i] = t;
        by_off[i] = t;
    }
    qsort(g->tensor_by_name, g->n_tensors, sizeof *g->tensor_by_name, cmp_tensor_name);
    qsort(by_off, g->n_tensors, sizeof *by_off, cmp_tensor_offset);
    for (size_t i = 1; i < g->n_tensors; i++) {
        const at_gguf_tensor_info *a = g->tensor_by_name[i - 1], *b = g->tensor_by_name[i];
        if (strcmp(a->name, b->name) == 0) {
            st = at_error(AT_ERR_FORMAT, "%s: tensor %s appears twice", what, b->name);
            goto done;
        }
    }
    const at_gguf_tensor_info *prev = NULL;
    for (size_t i = 0; i < g->n_tensors; i++) {
        const at_gguf_tensor_info *t = by_off[i];
        if (t->nbytes == 0) continue;
        if (prev && t->offset < prev->offset + prev->nbytes) {
            st = at_error(AT_ERR_FORMAT, "%s: tensors %s and %s overlap", what, prev->name, t->name);
            goto done;
        }
        prev = t;
    }
done:
    free(ks);
    free(by_off);
    if (st != AT_OK) {
        at_gguf_close(g);
        return st;
    }
    *out = g;
    return AT_OK;
}

at_status at_gguf_open(const char *path, at_gguf **out)
{
    *out = NULL;
    at_mapped_file m;
    AT_TRY(at_map_file(path, &m));
    at_status st = at_gguf_parse(m.data, m.size, path, out);
    if (st != AT_OK) {
        at_unmap_file(&m);
        return st;
    }
    (*out)->map = m;
    (*out)->mapped = 1;
    return AT_OK;
}

void at_gguf_close(at_gguf *g)
{
    if (!g) return;
    arena_free(&g->ar);
    free(g->kv);
    free(g->kv_by_key);
    free(g->tensors);
    free(g->tensor_by_name);
    free(g->what);
    if (g->mapped) at_unmap_file(&g->map);
    free(g);
}

uint32_t at_gguf_version(const at_gguf *g) { return g->version; }
size_t at_gguf_alignment(const at_gguf *g) { return g->alignment; }
size_t at_gguf_data_offset(const at_gguf *g) { return g->data_offset; }
size_t at_gguf_kv_count(const at_gguf *g) { return g->n_kv; }
const char *at_gguf_kv_key(const at_gguf *g, size_t i) { return i < g->n_kv ? g->kv[i].key : NULL; }
const at_gguf_value *at_gguf_kv_value(const at_gguf *g, size_t i) { return i < g->n_kv ? &g->kv[i].value : NULL; }

const at_gguf_value *at_gguf_get(const at_gguf *g, const char *key)
{
    /* During parsing (general.alignment) the sorted index does not exist yet. */
    if (!g->kv_by_key) {
        for (size_t i = 0; i < g->n_kv; i++)
            if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i].value;
        return NULL;
    }
    size_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->kv_by_key[mid]->key, key);
        if (c == 0) return &g->kv_by_key[mid]->value;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static at_status type_error(const at_gguf *g, const char *key, const at_gguf_value *v, const char *want)
{
    return at_error(AT_ERR_FORMAT, "%s: key %s is %s, expected %s", g->what, key, at_gguf_type_name(v->type), want);
}

at_status at_gguf_get_int(const at_gguf *g, const char *key, int64_t *out)
{
    const at_gguf_value *v = at_gguf_get(g, key);
    if (!v) return AT_ERR_NOT_FOUND;
    if (at_gguf_value_int(v, out) != AT_OK) return type_error(g, key, v, "an integer");
    return AT_OK;
}

at_status at_gguf_get_uint(const at_gguf *g, const char *key, uint64_t *out)
{
    const at_gguf_value *v = at_gguf_get(g, key);
    if (!v) return AT_ERR_NOT_FOUND;
    if (at_gguf_value_uint(v, out) != AT_OK) return type_error(g, key, v, "a non-negative integer");
    return AT_OK;
}

at_status at_gguf_get_float(const at_gguf *g, const char *key, double *out)
{
    const at_gguf_value *v = at_gguf_get(g, key);
    if (!v) return AT_ERR_NOT_FOUND;
    if (at_gguf_value_float(v, out) != AT_OK) return type_error(g, key, v, "a number");
    return AT_OK;
}

at_status at_gguf_get_bool(const at_gguf *g, const char *key, int *out)
{
    const at_gguf_value *v = at_gguf_get(g, key);
    if (!v) return AT_ERR_NOT_FOUND;
    if (v->type != AT_GGUF_BOOL) return type_error(g, key, v, "a bool");
    *out = v->v.b;
    return AT_OK;
}

at_status at_gguf_get_string(const at_gguf *g, const char *key, const char **s, size_t *len)
{
    const at_gguf_value *v = at_gguf_get(g, key);
    if (!v) return AT_ERR_NOT_FOUND;
    if (v->type != AT_GGUF_STRING) return type_error(g, key, v, "a string");
    *s = v->v.str.s;
    if (len) *len = v->v.str.len;
    return AT_OK;
}

at_status at_gguf_get_array(const at_gguf *g, const char *key, at_gguf_type *elem_type, size_t *count)
{
    const at_gguf_value *v = at_gguf_get(g, key);
    if (!v) return AT_ERR_NOT_FOUND;
    if (v->type != AT_GGUF_ARRAY) return type_error(g, key, v, "an array");
    if (elem_type) *elem_type = v->v.arr.type;
    if (count) *count = v->v.arr.count;
    return AT_OK;
}

size_t at_gguf_tensor_count(const at_gguf *g) { return g->n_tensors; }
const at_gguf_tensor_info *at_gguf_tensor_at(const at_gguf *g, size_t i) { return i < g->n_tensors ? &g->tensors[i] : NULL; }

const at_gguf_tensor_info *at_gguf_find_tensor(const at_gguf *g, const char *name)
{
    size_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->tensor_by_name[mid]->name, name);
        if (c == 0) return g->tensor_by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ---- tensors ------------------------------------------------------------ */

static int is_float_dtype(int t) { return t == AT_F32 || t == AT_F16 || t == AT_BF16; }

static void store_f(uint8_t *p, at_dtype t, float v)
{
    if (t == AT_F32) {
        memcpy(p, &v, 4);
        return;
    }
    uint16_t h = t == AT_BF16 ? at_f32_to_bf16(v) : at_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Decodes n elements (a multiple of the block for Q types) of ggml type
 * `type` at src into floats.
 *   Q8_0 block: f16 d, int8 q[32]:           x[j] = d * q[j]
 *   Q4_0 block: f16 d, u8 qs[16] (nibbles):  x[j] = d * ((qs[j] & 15) - 8),
 *                                            x[j+16] = d * ((qs[j] >> 4) - 8) */
static void decode_row(uint32_t type, const uint8_t *src, size_t n, float *dst)
{
    uint16_t h;
    switch (type) {
    case AT_GGML_F32: memcpy(dst, src, n * 4); break;
    case AT_GGML_F16:
        for (size_t i = 0; i < n; i++) { memcpy(&h, src + 2 * i, 2); dst[i] = at_f16_to_f32(h); }
        break;
    case AT_GGML_BF16:
        for (size_t i = 0; i < n; i++) { memcpy(&h, src + 2 * i, 2); dst[i] = at_bf16_to_f32(h); }
        break;
    case AT_GGML_Q8_0:
        for (size_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = src + b * 34;
            memcpy(&h, blk, 2);
            float d = at_f16_to_f32(h);
            for (int j = 0; j < 32; j++) dst[b * 32 + j] = d * (float)(int8_t)blk[2 + j];
        }
        break;
    case AT_GGML_Q4_0:
        for (size_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = src + b * 18;
            memcpy(&h, blk, 2);
            float d = at_f16_to_f32(h);
            for (int j = 0; j < 16; j++) {
                dst[b * 32 + j] = d * (float)((int)(blk[2 + j] & 15) - 8);
                dst[b * 32 + j + 16] = d * (float)((int)(blk[2 + j] >> 4) - 8);
            }
        }
        break;
    default: break;
    }
}

at_status at_gguf_tensor(const at_gguf *g, const at_gguf_tensor_info *info, at_dtype want, at_tensor **out)
{
    *out = NULL;
    int have = at_ggml_to_dtype(info->type);
    if (have < 0)
        return at_error(AT_ERR_UNSUPPORTED, "%s: tensor %s: ggml type %s is not supported", g->what, info->name,
                        at_ggml_type_name(info->type));
    int64_t shape[AT_MAX_DIMS];
    for (int d = 0; d < info->n_dims; d++) shape[d] = info->ne[info->n_dims - 1 - d];
    if (want == AT_GGUF_KEEP_DTYPE) want = (at_dtype)have;
    if ((int)want == have) {
        /* Block types carry no alignment need beyond bytes; plain types are
         * aligned because offsets are multiples of the (power of two >= 4 in
         * practice) alignment. Copy if the file's alignment does not give it. */
        size_t es = at_dtype_block_bytes(want);
        if (at_dtype_block_elems(want) > 1 || ((uintptr_t)info->data % es) == 0)
            return at_tensor_wrap((void *)info->data, want, info->n_dims, shape, info->name, out);
        at_tensor *t = NULL;
        AT_TRY(at_tensor_new(at_cpu_backend(), want, info->n_dims, shape, info->name, &t));
        memcpy(at_tensor_data(t), info->data, info->nbytes);
        *out = t;
        return AT_OK;
    }
    if (!is_float_dtype(want) || !(is_float_dtype(have) || have == AT_Q8_0 || have == AT_Q4_0))
        return at_error(AT_ERR_UNSUPPORTED, "%s: tensor %s: cannot convert %s to %s", g->what, info->name,
                        at_ggml_type_name(info->type), at_dtype_name(want));
    at_tensor *t = NULL;
    AT_TRY(at_tensor_new(at_cpu_backend(), want, info->n_dims, shape, info->name, &t));
    if (info->nbytes == 0) { /* an empty tensor: nothing to decode */
        *out = t;
        return AT_OK;
    }
    size_t row = (size_t)info->ne[0];
    size_t rows = (size_t)(info->ne[1] * info->ne[2] * info->ne[3]);
    size_t row_bytes = row / at_ggml_block_elems(info->type) * at_ggml_block_bytes(info->type);
    float *buf = malloc((row ? row : 1) * sizeof *buf);
    if (!buf) {
        at_tensor_free(t);
        return at_error(AT_ERR_NOMEM, "%s: tensor %s: out of memory", g->what, info->name);
    }
    uint8_t *dst = at_tensor_data(t);
    size_t ds = at_dtype_block_bytes(want);
    for (size_t r = 0; r < rows; r++) {
        decode_row(info->type, info->data + r * row_bytes, row, buf);
        for (size_t j = 0; j < row; j++) store_f(dst + (r * row + j) * ds, want, buf[j]);
    }
    free(buf);
    *out = t;
    return AT_OK;
}

at_status at_gguf_get_tensor(const at_gguf *g, const char *name, at_dtype want, at_tensor **out)
{
    *out = NULL;
    const at_gguf_tensor_info *info = at_gguf_find_tensor(g, name);
    if (!info) return at_error(AT_ERR_NOT_FOUND, "%s: tensor %s is missing", g->what, name);
    return at_gguf_tensor(g, info, want, out);
}

/* ---- writing ------------------------------------------------------------ */

typedef struct {
    char *key;
    at_gguf_value v;
} wkv;

typedef struct {
    char *name;
    uint32_t type;
    int n_dims;
    int64_t ne[AT_GGUF_MAX_DIMS];
    const void *data;
    size_t nbytes;
} wtensor;

struct at_gguf_writer {
    arena ar;
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

at_status at_gguf_writer_new(at_gguf_writer **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? AT_OK : at_error(AT_ERR_NOMEM, "gguf writer: out of memory");
}

void at_gguf_writer_free(at_gguf_writer *w)
{
    if (!w) return;
    arena_free(&w->ar);
    free(w->kv);
    free(w->t);
    free(w);
}

static char *arena_strdup(arena *a, const char *s, size_t n)
{
    char *d = arena_alloc(a, n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Deep copy into the writer's arena, checking the types on the way. */
static at_status copy_value(at_gguf_writer *w, const char *key, const at_gguf_value *src, at_gguf_value *dst,
                            int depth)
{
    *dst = *src;
    if (scalar_size(src->type)) return AT_OK;
    if (src->type == AT_GGUF_STRING) {
        if (!src->v.str.s && src->v.str.len)
            return at_error(AT_ERR_INVALID, "gguf writer: key %s: NULL string", key);
        dst->v.str.s = arena_strdup(&w->ar, src->v.str.s ? src->v.str.s : "", src->v.str.len);
        return dst->v.str.s ? AT_OK : at_error(AT_ERR_NOMEM, "gguf writer: out of memory");
    }
    if (src->type != AT_GGUF_ARRAY)
        return at_error(AT_ERR_INVALID, "gguf writer: key %s: unknown value type %d", key, (int)src->type);
    if (depth >= AT_GGUF_MAX_DEPTH)
        return at_error(AT_ERR_INVALID, "gguf writer: key %s: arrays nested deeper than %d", key, AT_GGUF_MAX_DEPTH);
    size_t n = src->v.arr.count, es = scalar_size(src->v.arr.type);
    if (es) {
        uint8_t *raw = arena_alloc(&w->ar, n * es + 1);
        if (!raw) return at_error(AT_ERR_NOMEM, "gguf writer: out of memory");
        if (n) memcpy(raw, src->v.arr.raw, n * es);
        dst->v.arr.raw = raw;
        dst->v.arr.items = NULL;
        return AT_OK;
    }
    if (src->v.arr.type != AT_GGUF_STRING && src->v.arr.type != AT_GGUF_ARRAY)
        return at_error(AT_ERR_INVALID, "gguf writer: key %s: array of unknown type %d", key, (int)src->v.arr.type);
    at_gguf_value *items = arena_alloc(&w->ar, n * sizeof *items + 1);
    if (!items) return at_error(AT_ERR_NOMEM, "gguf writer: out of memory");
    for (size_t i = 0; i < n; i++) {
        if (src->v.arr.items[i].type != src->v.arr.type)
            return at_error(AT_ERR_INVALID, "gguf writer: key %s: element %zu is %s in an array of %s", key, i,
                            at_gguf_type_name(src->v.arr.items[i].type), at_gguf_type_name(src->v.arr.type));
        AT_TRY(copy_value(w, key, &src->v.arr.items[i], &items[i], depth + 1));
    }
    dst->v.arr.items = items;
    dst->v.arr.raw = NULL;
    return AT_OK;
}

at_status at_gguf_add_value(at_gguf_writer *w, const char *key, const at_gguf_value *v)
{
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return at_error(AT_ERR_INVALID, "gguf writer: key %s added twice", key);
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        wkv *n = realloc(w->kv, cap * sizeof *n);
        if (!n) return at_error(AT_ERR_NOMEM, "gguf writer: out of memory");
        w->kv = n;
        w->cap_kv = cap;
    }
    wkv *e = &w->kv[w->n_kv];
    e->key = arena_strdup(&w->ar, key, strlen(key));
    if (!e->key) return at_error(AT_ERR_NOMEM, "gguf writer: out of memory");
    AT_TRY(copy_value(w, key, v, &e->v, 0));
    w->n_kv++;
    return AT_OK;
}

#define ADD_SCALAR(fn, ctype, gtype, field)                                           \
    at_status fn(at_gguf_writer *w, const char *key, ctype x)                         \
    {                                                                                 \
        at_gguf_value v;                                                              \
        memset(&v, 0, sizeof v);                                                      \
        v.type = gtype;                                                               \
        v.v.field = x;                                                                \
        return at_gguf_add_value(w, key, &v);                                         \
    }
ADD_SCALAR(at_gguf_add_u8, uint8_t, AT_GGUF_UINT8, u)
ADD_SCALAR(at_gguf_add_i8, int8_t, AT_GGUF_INT8, i)
ADD_SCALAR(at_gguf_add_u16, uint16_t, AT_GGUF_UINT16, u)
ADD_SCALAR(at_gguf_add_i16, int16_t, AT_GGUF_INT16, i)
ADD_SCALAR(at_gguf_add_u32, uint32_t, AT_GGUF_UINT32, u)
ADD_SCALAR(at_gguf_add_i32, int32_t, AT_GGUF_INT32, i)
ADD_SCALAR(at_gguf_add_u64, uint64_t, AT_GGUF_UINT64, u)
ADD_SCALAR(at_gguf_add_i64, int64_t, AT_GGUF_INT64, i)
ADD_SCALAR(at_gguf_add_f32, float, AT_GGUF_FLOAT32, f)
ADD_SCALAR(at_gguf_add_f64, double, AT_GGUF_FLOAT64, f)

at_status at_gguf_add_bool(at_gguf_writer *w, const char *key, int x)
{
    at_gguf_value v;
    memset(&v, 0, sizeof v);
    v.type = AT_GGUF_BOOL;
    v.v.b = x != 0;
    return at_gguf_add_value(w, key, &v);
}

at_status at_gguf_add_string(at_gguf_writer *w, const char *key, const char *s)
{
    at_gguf_value v;
    memset(&v, 0, sizeof v);
    v.type = AT_GGUF_STRING;
    v.v.str.s = s;
    v.v.str.len = strlen(s);
    return at_gguf_add_value(w, key, &v);
}

at_status at_gguf_add_array(at_gguf_writer *w, const char *key, at_gguf_type elem_type, const void *data,
                            size_t count)
{
    if (!scalar_size(elem_type))
        return at_error(AT_ERR_INVALID, "gguf writer: key %s: at_gguf_add_array takes numbers or bools, not %s", key,
                        at_gguf_type_name(elem_type));
    at_gguf_value v;
    memset(&v, 0, sizeof v);
    v.type = AT_GGUF_ARRAY;
    v.v.arr.type = elem_type;
    v.v.arr.count = count;
    v.v.arr.raw = data;
    return at_gguf_add_value(w, key, &v);
}

at_status at_gguf_add_string_array(at_gguf_writer *w, const char *key, const char *const *strs, size_t count)
{
    at_gguf_value *items = calloc(count ? count : 1, sizeof *items);
    if (!items) return at_error(AT_ERR_NOMEM, "gguf writer: out of memory");
    for (size_t i = 0; i < count; i++) {
        items[i].type = AT_GGUF_STRING;
        items[i].v.str.s = strs[i];
        items[i].v.str.len = strlen(strs[i]);
    }
    at_gguf_value v;
    memset(&v, 0, sizeof v);
    v.type = AT_GGUF_ARRAY;
    v.v.arr.type = AT_GGUF_STRING;
    v.v.arr.count = count;
    v.v.arr.items = items;
    at_status st = at_gguf_add_value(w, key, &v);
    free(items);
    return st;
}

at_status at_gguf_add_tensor(at_gguf_writer *w, const char *name, uint32_t type, int n_dims, const int64_t *ne,
                             const void *data, size_t nbytes)
{
    const ggml_traits *tr = traits_of(type);
    if (!tr) return at_error(AT_ERR_INVALID, "gguf writer: tensor %s: unknown ggml type %u", name, type);
    if (n_dims < 1 || n_dims > AT_GGUF_MAX_DIMS)
        return at_error(AT_ERR_INVALID, "gguf writer: tensor %s: %d dimensions", name, n_dims);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return at_error(AT_ERR_INVALID, "gguf writer: tensor %s added twice", name);
    uint64_t nb = 0;
    int ok = ne[0] >= 0 && ne[0] % (int64_t)tr->blk == 0;
    if (ok) nb = (uint64_t)ne[0] / tr->blk * tr->bytes;
    for (int d = 1; ok && d < n_dims; d++) ok = ne[d] >= 0 && !__builtin_mul_overflow(nb, (uint64_t)ne[d], &nb);
    if (!ok || nb != nbytes)
        return at_error(AT_ERR_INVALID, "gguf writer: tensor %s: %zu bytes given, its type %s and dims need %llu", name,
                        nbytes, tr->name, (unsigned long long)nb);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 16;
        wtensor *n = realloc(w->t, cap * sizeof *n);
        if (!n) return at_error(AT_ERR_NOMEM, "gguf writer: out of memory");
        w->t = n;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    t->name = arena_strdup(&w->ar, name, strlen(name));
    if (!t->name) return at_error(AT_ERR_NOMEM, "gguf writer: out of memory");
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < AT_GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->data = data;
    t->nbytes = nbytes;
    w->n_t++;
    return AT_OK;
}

at_status at_gguf_add_at_tensor(at_gguf_writer *w, const char *name, const at_tensor *t)
{
    if (!name) name = t->name;
    int type = at_ggml_from_dtype(t->dtype);
    if (type < 0)
        return at_error(AT_ERR_UNSUPPORTED, "gguf writer: tensor %s: dtype %s has no ggml type", name,
                        at_dtype_name(t->dtype));
    const void *data = at_tensor_data(t);
    if (!data) return at_error(AT_ERR_INVALID, "gguf writer: tensor %s is not in host memory", name);
    int64_t ne[AT_GGUF_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) ne[d] = t->shape[t->ndim - 1 - d];
    return at_gguf_add_tensor(w, name, (uint32_t)type, t->ndim, ne, data, at_tensor_nbytes(t));
}

/* A growable byte buffer for the header; `failed` latches out-of-memory. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    int failed;
} bytebuf;

static void bb_put(bytebuf *b, const void *d, size_t n)
{
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np) {
            b->failed = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
}
static void bb_u32(bytebuf *b, uint32_t v) { bb_put(b, &v, 4); }
static void bb_u64(bytebuf *b, uint64_t v) { bb_put(b, &v, 8); }
static void bb_str(bytebuf *b, const char *s, size_t n)
{
    bb_u64(b, n);
    bb_put(b, s, n);
}

static void put_scalar(bytebuf *b, const at_gguf_value *v)
{
    uint8_t u8; uint16_t u16; uint32_t u32; float f32;
    switch (v->type) {
    case AT_GGUF_UINT8: u8 = (uint8_t)v->v.u; bb_put(b, &u8, 1); break;
    case AT_GGUF_INT8: u8 = (uint8_t)(int8_t)v->v.i; bb_put(b, &u8, 1); break;
    case AT_GGUF_BOOL: u8 = v->v.b ? 1 : 0; bb_put(b, &u8, 1); break;
    case AT_GGUF_UINT16: u16 = (uint16_t)v->v.u; bb_put(b, &u16, 2); break;
    case AT_GGUF_INT16: u16 = (uint16_t)(int16_t)v->v.i; bb_put(b, &u16, 2); break;
    case AT_GGUF_UINT32: u32 = (uint32_t)v->v.u; bb_put(b, &u32, 4); break;
    case AT_GGUF_INT32: u32 = (uint32_t)(int32_t)v->v.i; bb_put(b, &u32, 4); break;
    case AT_GGUF_FLOAT32: f32 = (float)v->v.f; bb_put(b, &f32, 4); break;
    case AT_GGUF_UINT64: bb_u64(b, v->v.u); break;
    case AT_GGUF_INT64: bb_u64(b, (uint64_t)v->v.i); break;
    case AT_GGUF_FLOAT64: bb_put(b, &v->v.f, 8); break;
    default: break;
    }
}

static void put_value(bytebuf *b, const at_gguf_value *v)
{
    if (scalar_size(v->type)) {
        put_scalar(b, v);
    } else if (v->type == AT_GGUF_STRING) {
        bb_str(b, v->v.str.s, v->v.str.len);
    } else if (v->type == AT_GGUF_ARRAY) {
        bb_u32(b, (uint32_t)v->v.arr.type);
        bb_u64(b, v->v.arr.count);
        size_t es = scalar_size(v->v.arr.type);
        if (es) bb_put(b, v->v.arr.raw, v->v.arr.count * es);
        else
            for (size_t i = 0; i < v->v.arr.count; i++) put_value(b, &v->v.arr.items[i]);
    }
}

/* Header, then each tensor's bytes at its aligned offset, through an atomic
 * file (base/file.h): readers never see a half-written GGUF. */
static at_status write_atomic_parts(const char *path, const bytebuf *hdr, const at_gguf_writer *w, size_t align)
{
    at_atomic_file f;
    AT_TRY(at_atomic_open(&f, path));
    size_t pos = hdr->len;
    at_status st = at_atomic_write(&f, hdr->p, hdr->len);
    for (size_t i = 0; st == AT_OK && i < w->n_t; i++) {
        size_t pad = (align - pos % align) % align;
        st = at_atomic_zeros(&f, pad);
        pos += pad;
        if (st == AT_OK && w->t[i].nbytes) st = at_atomic_write(&f, w->t[i].data, w->t[i].nbytes);
        if (st != AT_OK) at_error_wrap(st, "tensor %s", w->t[i].name);
        pos += w->t[i].nbytes;
    }
    if (st != AT_OK) {
        at_atomic_abort(&f);
        return st;
    }
    return at_atomic_commit(&f);
}

at_status at_gguf_write(const at_gguf_writer *w, const char *path)
{
    size_t align = AT_GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, "general.alignment") == 0) {
            const at_gguf_value *v = &w->kv[i].v;
            if (v->type != AT_GGUF_UINT32 || v->v.u == 0 || (v->v.u & (v->v.u - 1)) != 0)
                return at_error(AT_ERR_INVALID, "%s: general.alignment must be a power of two stored as uint32", path);
            align = (size_t)v->v.u;
        }
    bytebuf b = {0};
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, 3);
    bb_u64(&b, w->n_t);
    bb_u64(&b, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        bb_str(&b, w->kv[i].key, strlen(w->kv[i].key));
        bb_u32(&b, (uint32_t)w->kv[i].v.type);
        put_value(&b, &w->kv[i].v);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        off = (off + align - 1) / align * align;
        bb_str(&b, t->name, strlen(t->name));
        bb_u32(&b, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) bb_u64(&b, (uint64_t)t->ne[d]);
        bb_u32(&b, t->type);
        bb_u64(&b, off);
        off += t->nbytes;
    }
    /* Padding up to the data area (also written when there are no tensors, as llama.cpp does). */
    static const uint8_t zeros[256];
    size_t pad = (align - b.len % align) % align;
    while (pad > 0) {
        size_t k = pad < sizeof zeros ? pad : sizeof zeros;
        bb_put(&b, zeros, k);
        pad -= k;
    }
    at_status st = b.failed ? at_error(AT_ERR_NOMEM, "%s: out of memory building the header", path)
                            : write_atomic_parts(path, &b, w, align);
    free(b.p);
    return st;
}

/* ---- Llama-family conventions ------------------------------------------- */

static const struct {
    const char *gguf, *hf;
} block_names[] = {
    {"attn_norm", "input_layernorm"},     {"attn_q", "self_attn.q_proj"},     {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},       {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},  {"ffn_norm", "post_attention_layernorm"}, {"ffn_gate", "mlp.gate_proj"},
    {"ffn_down", "mlp.down_proj"},        {"ffn_up", "mlp.up_proj"},
};
static const struct {
    const char *gguf, *hf;
} top_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

/* Splits "<prefix><N>.<mid>.<suffix>" where suffix is weight or bias. */
static int split_block(const char *s, const char *prefix, long *layer, char *mid, size_t mid_len, const char **suffix)
{
    size_t pl = strlen(prefix);
    if (strncmp(s, prefix, pl) != 0) return 0;
    s += pl;
    if (*s < '0' || *s > '9') return 0;
    char *end;
    errno = 0;
    long n = strtol(s, &end, 10);
    if (errno || *end != '.' || n < 0 || n > 1000000) return 0;
    const char *m = end + 1;
    const char *dot = strrchr(m, '.');
    if (!dot || (strcmp(dot, ".weight") != 0 && strcmp(dot, ".bias") != 0)) return 0;
    size_t ml = (size_t)(dot - m);
    if (ml == 0 || ml >= mid_len) return 0;
    memcpy(mid, m, ml);
    mid[ml] = '\0';
    *layer = n;
    *suffix = dot + 1;
    return 1;
}

/* One table, read in either direction: to_hf maps GGUF names to HF ones. */
static int rename_tensor(const char *name, char *out, size_t out_len, int to_hf)
{
    for (size_t i = 0; i < sizeof top_names / sizeof top_names[0]; i++) {
        const char *from = to_hf ? top_names[i].gguf : top_names[i].hf;
        const char *to = to_hf ? top_names[i].hf : top_names[i].gguf;
        if (strcmp(name, from) == 0) return snprintf(out, out_len, "%s", to) < (int)out_len;
    }
    const char *from_prefix = to_hf ? "blk." : "model.layers.", *to_prefix = to_hf ? "model.layers." : "blk.";
    long n;
    char mid[64];
    const char *suffix;
    if (!split_block(name, from_prefix, &n, mid, sizeof mid, &suffix)) return 0;
    for (size_t i = 0; i < sizeof block_names / sizeof block_names[0]; i++)
        if (strcmp(mid, to_hf ? block_names[i].gguf : block_names[i].hf) == 0)
            return snprintf(out, out_len, "%s%ld.%s.%s", to_prefix, n, to_hf ? block_names[i].hf : block_names[i].gguf,
                            suffix) < (int)out_len;
    return 0;
}

int at_gguf_name_to_hf(const char *name, char *out, size_t out_len) { return rename_tensor(name, out, out_len, 1); }

int at_gguf_name_from_hf(const char *name, char *out, size_t out_len) { return rename_tensor(name, out, out_len, 0); }

int at_gguf_qk_interleaved(const at_gguf *g)
{
    const char *arch = NULL;
    if (at_gguf_get_string(g, "general.architecture", &arch, NULL) != AT_OK) return 0;
    return strcmp(arch, "llama") == 0;
}
