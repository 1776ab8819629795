/* Parquet pages to values and levels, and levels to JSON rows (the record
 * assembly of the Dremel paper, one column at a time, then merged).
 *
 * Levels: an entry (r, d) of a column says that the value starts a new
 * element of the r-th repeated ancestor (0: a new row) and that its first d
 * optional-or-repeated ancestors are present; d == max_def means the value
 * itself is there. Each column's entries are turned into a row tree by a
 * fixed list of steps derived from its schema path (an object key, or an
 * array element), and the trees of a row's columns are merged key by key,
 * arrays element by element. */
#include "data/parquet.h"

#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>
#include "data/parquet_internal.h"

#define MAX_PAGE ((size_t)1 << 28)

int at_parquet_sniff(const void *data, size_t len) { return len >= 4 && !memcmp(data, "PAR1", 4); }

/* ---- steps from a schema path to a place in a row's JSON ---- */

enum { STEP_FIELD, STEP_LIST };

typedef struct {
    int kind;
    const char *name; /* STEP_FIELD */
    uint32_t null_below; /* FIELD: d below this -> null (0: required) */
    uint32_t rep, empty_below, elem_null_below; /* LIST */
} step;

typedef struct {
    const uint8_t *s; /* BYTE_ARRAY / FIXED bytes, or NULL */
    uint32_t len;
    union {
        int64_t i;
        double f;
    } u;
} pq_value;

typedef struct {
    int node, type, type_length;
    uint32_t max_def, max_rep;
    step steps[2 * PQ_MAX_DEPTH];
    int n_steps;
    /* one row group's decoded data */
    uint32_t *rep, *def;
    size_t n, cap;
    pq_value *vals;
    size_t nv, vcap;
    pq_value *dict;
    size_t n_dict;
    size_t pos, vpos; /* assembly cursors */
} column;

typedef struct {
    const char *name;
    pq_meta meta;
    column *cols;
    size_t max_entries, entries_left; /* of the current row group, all columns */
    uint8_t **bufs; /* decompressed pages of the current row group */
    size_t n_bufs, cap_bufs;
} reader;

/* A group annotated LIST whose repeated child R wraps one element E: the
 * standard three-level list, unless R is named "array" or "<list>_tuple" (the
 * older two-level forms, where R itself is the element). */
static int three_level(const pq_meta *m, int list, int r)
{
    const pq_node *R = &m->nodes[r];
    if (R->type != -1 || R->num_children != 1) return 0;
    if (!strcmp(R->name, "array")) return 0;
    size_t ln = strlen(m->nodes[list].name);
    return !(strncmp(R->name, m->nodes[list].name, ln) == 0 && !strcmp(R->name + ln, "_tuple"));
}

static void add_step(column *c, int kind, const char *name, uint32_t a, uint32_t b, uint32_t e)
{
    step *s = &c->steps[c->n_steps++];
    s->kind = kind;
    s->name = name;
    s->null_below = kind == STEP_FIELD ? a : 0;
    s->rep = a;
    s->empty_below = b;
    s->elem_null_below = e;
}

static void plan_column(const pq_meta *m, column *c, int leaf)
{
    int path[PQ_MAX_DEPTH + 1], k = 0;
    uint32_t def[PQ_MAX_DEPTH + 1], rep[PQ_MAX_DEPTH + 1], d = 0, r = 0;
    for (int i = leaf; i > 0; i = m->nodes[i].parent) path[k++] = i;
    for (int a = 0, b = k - 1; a < b; a++, b--) {
        int t = path[a];
        path[a] = path[b];
        path[b] = t;
    }
    for (int i = 0; i < k; i++) {
        int rp = m->nodes[path[i]].repetition;
        if (rp != PQ_REQUIRED) d++;
        if (rp == PQ_REPEATED) r++;
        def[i] = d;
        rep[i] = r;
    }
    c->node = leaf;
    c->type = m->nodes[leaf].type;
    c->type_length = m->nodes[leaf].type_length;
    c->max_def = d;
    c->max_rep = r;
    int elem = 0; /* the node at i is an array element: no key of its own */
    for (int i = 0; i < k;) {
        const pq_node *n = &m->nodes[path[i]];
        if (!elem) add_step(c, STEP_FIELD, n->name, n->repetition == PQ_OPTIONAL ? def[i] : 0, 0, 0);
        elem = 0;
        if (n->repetition == PQ_REPEATED) { /* a bare repeated field: an array of n */
            add_step(c, STEP_LIST, NULL, rep[i], def[i], 0);
            i++;
        } else if (n->is_list && i + 1 < k && m->nodes[path[i + 1]].repetition == PQ_REPEATED) {
            if (i + 2 < k && three_level(m, path[i], path[i + 1]) && m->nodes[path[i + 2]].repetition != PQ_REPEATED) {
                const pq_node *e = &m->nodes[path[i + 2]];
                add_step(c, STEP_LIST, NULL, rep[i + 1], def[i + 1], e->repetition == PQ_OPTIONAL ? def[i + 2] : 0);
                i += 2;
                elem = 1;
            } else {
                add_step(c, STEP_LIST, NULL, rep[i + 1], def[i + 1], 0);
                i += 2;
            }
        } else {
            i++;
        }
    }
}

/* ---- decoding ---- */

static at_status bad(const reader *rd, const column *c, const char *what)
{
    return at_error(AT_ERR_FORMAT, "%s: column '%s': %s", rd->name, rd->meta.nodes[c->node].name, what);
}

/* The RLE / bit-packed hybrid: n values of `width` bits from p[0..len). */
static int hybrid(const uint8_t *p, size_t len, int width, uint32_t *out, size_t n)
{
    size_t got = 0, vb = ((size_t)width + 7) / 8;
    const uint8_t *end = p + len;
    if (width < 0 || width > 32) return -1;
    while (got < n) {
        uint64_t h = 0;
        int shift = 0;
        for (;;) {
            if (p >= end || shift > 35) return -1;
            uint8_t b = *p++;
            h |= (uint64_t)(b & 0x7f) << shift;
            shift += 7;
            if (!(b & 0x80)) break;
        }
        if (h & 1) { /* bit-packed: (h >> 1) groups of eight values */
            uint64_t groups = h >> 1;
            if (groups > (uint64_t)(end - p) || groups * (uint64_t)width > (uint64_t)(end - p)) return -1;
            size_t bytes = (size_t)groups * (size_t)width, cnt = (size_t)groups * 8;
            for (size_t j = 0; j < cnt && got < n; j++) {
                uint64_t bit = (uint64_t)j * (uint64_t)width, acc = 0;
                size_t byte = (size_t)(bit >> 3);
                for (size_t q = 0; q < 5 && byte + q < bytes; q++) acc |= (uint64_t)p[byte + q] << (8 * q);
                out[got++] = (uint32_t)((acc >> (bit & 7)) & ((width == 32) ? 0xffffffffu : ((1u << width) - 1)));
            }
            p += bytes;
        } else { /* a run of one value */
            uint64_t cnt = h >> 1;
            if (vb > (size_t)(end - p)) return -1;
            uint32_t v = 0;
            for (size_t q = 0; q < vb; q++) v |= (uint32_t)p[q] << (8 * q);
            p += vb;
            for (uint64_t j = 0; j < cnt && got < n; j++) out[got++] = v;
        }
    }
    return 0;
}

static int bit_width(uint32_t max)
{
    int w = 0;
    while (w < 32 && (max >> w)) w++;
    return w;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 1024;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

/* n PLAIN values of the column's type from p[0..len) into out. */
static int plain(const column *c, const uint8_t *p, size_t len, pq_value *out, size_t n)
{
    const uint8_t *end = p + len;
    static const size_t width[] = {0, 4, 8, 12, 4, 8, 0, 0};
    if (c->type == PQ_BOOLEAN) {
        if (n > len * 8) return -1;
        for (size_t i = 0; i < n; i++) out[i].u.i = (p[i >> 3] >> (i & 7)) & 1;
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        pq_value *v = &out[i];
        memset(v, 0, sizeof *v);
        if (c->type == PQ_BYTE_ARRAY || c->type == PQ_FIXED) {
            uint64_t l = (uint64_t)c->type_length;
            if (c->type == PQ_BYTE_ARRAY) {
                if ((size_t)(end - p) < 4) return -1;
                l = (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
                p += 4;
            }
            if (l > (uint64_t)(end - p)) return -1;
            v->s = p;
            v->len = (uint32_t)l;
            p += l;
            continue;
        }
        size_t w = width[c->type];
        if ((size_t)(end - p) < w) return -1;
        uint64_t x = 0;
        for (size_t q = 0; q < w && q < 8; q++) x |= (uint64_t)p[q] << (8 * q);
        if (c->type == PQ_INT32) v->u.i = (int32_t)(uint32_t)x;
        else if (c->type == PQ_INT64) v->u.i = (int64_t)x;
        else if (c->type == PQ_FLOAT) {
            uint32_t b = (uint32_t)x;
            float f;
            memcpy(&f, &b, 4);
            v->u.f = f;
        } else if (c->type == PQ_DOUBLE) memcpy(&v->u.f, &x, 8);
        p += w;
    }
    return 0;
}

static at_status decompress(reader *rd, const column *c, int codec, const uint8_t *src, size_t n, size_t out_len,
                            const uint8_t **out)
{
    if (codec == PQ_UNCOMPRESSED) {
        if (n != out_len) return bad(rd, c, "uncompressed page sizes disagree");
        *out = src;
        return AT_OK;
    }
    if (out_len > MAX_PAGE) return bad(rd, c, "page larger than 256 MiB");
    if (grow((void **)&rd->bufs, &rd->cap_bufs, rd->n_bufs + 1, sizeof *rd->bufs))
        return at_error(AT_ERR_NOMEM, "out of memory");
    uint8_t *dst = malloc(out_len ? out_len : 1);
    if (!dst) return at_error(AT_ERR_NOMEM, "%s: out of memory for a %zu-byte page", rd->name, out_len);
    rd->bufs[rd->n_bufs++] = dst;
    *out = dst;
    if (codec == PQ_SNAPPY) {
        size_t ul = 0, got = out_len;
        if (snappy_uncompressed_length((const char *)src, n, &ul) != SNAPPY_OK || ul != out_len ||
            snappy_uncompress((const char *)src, n, (char *)dst, &got) != SNAPPY_OK || got != out_len)
            return bad(rd, c, "corrupt SNAPPY page");
    } else if (codec == PQ_ZSTD) {
        size_t got = ZSTD_decompress(dst, out_len, src, n);
        if (ZSTD_isError(got) || got != out_len) return bad(rd, c, "corrupt ZSTD page");
    } else if (codec == PQ_GZIP) {
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, 15 + 32) != Z_OK) return at_error(AT_ERR_NOMEM, "out of memory (zlib)");
        z.next_in = (Bytef *)(uintptr_t)src;
        z.avail_in = (uInt)n;
        z.next_out = dst;
        z.avail_out = (uInt)out_len;
        int zr = n > UINT32_MAX ? Z_DATA_ERROR : inflate(&z, Z_FINISH);
        size_t got = out_len - z.avail_out;
        inflateEnd(&z);
        if (zr != Z_STREAM_END || got != out_len) return bad(rd, c, "corrupt GZIP page");
    } else {
        char msg[64];
        snprintf(msg, sizeof msg, "compression codec %d is not supported", codec);
        return at_error(AT_ERR_UNSUPPORTED, "%s: column '%s': %s (supported: none, SNAPPY, GZIP, ZSTD)", rd->name,
                        rd->meta.nodes[c->node].name, msg);
    }
    return AT_OK;
}

/* Levels of n entries: v1 pages prefix them with a 4-byte length, v2 give it. */
static at_status levels(reader *rd, const column *c, const uint8_t **p, const uint8_t *end, int64_t given,
                        uint32_t max, uint32_t *out, size_t n)
{
    if (max == 0) {
        memset(out, 0, n * sizeof *out);
        return AT_OK;
    }
    size_t len;
    if (given < 0) {
        if (end - *p < 4) return bad(rd, c, "levels cut short");
        len = (size_t)(*p)[0] | (size_t)(*p)[1] << 8 | (size_t)(*p)[2] << 16 | (size_t)(*p)[3] << 24;
        *p += 4;
    } else {
        len = (size_t)given;
    }
    if (len > (size_t)(end - *p) || hybrid(*p, len, bit_width(max), out, n)) return bad(rd, c, "malformed levels");
    for (size_t i = 0; i < n; i++)
        if (out[i] > max) return bad(rd, c, "level above the schema's maximum");
    *p += len;
    return AT_OK;
}

static at_status values(reader *rd, column *c, int encoding, const uint8_t *p, const uint8_t *end, size_t nv)
{
    if (grow((void **)&c->vals, &c->vcap, c->nv + nv + 1, sizeof *c->vals))
        return at_error(AT_ERR_NOMEM, "out of memory");
    pq_value *out = c->vals + c->nv;
    size_t len = (size_t)(end - p);
    if (encoding == PQ_PLAIN) {
        if (plain(c, p, len, out, nv)) return bad(rd, c, "PLAIN values cut short");
    } else if (encoding == PQ_PLAIN_DICTIONARY || encoding == PQ_RLE_DICTIONARY) {
        if (!c->dict && nv) return bad(rd, c, "dictionary-encoded page without a dictionary");
        uint32_t *idx = malloc((nv ? nv : 1) * sizeof *idx);
        if (!idx) return at_error(AT_ERR_NOMEM, "out of memory");
        int ok = nv == 0 || (len >= 1 && hybrid(p + 1, len - 1, p[0], idx, nv) == 0);
        for (size_t i = 0; ok && i < nv; i++) {
            if (idx[i] >= c->n_dict) ok = 0;
            else out[i] = c->dict[idx[i]];
        }
        free(idx);
        if (!ok) return bad(rd, c, "malformed dictionary indices");
    } else if (encoding == PQ_RLE && c->type == PQ_BOOLEAN) {
        uint32_t *bits = malloc((nv ? nv : 1) * sizeof *bits);
        if (!bits) return at_error(AT_ERR_NOMEM, "out of memory");
        size_t l = len >= 4 ? (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24 : 0;
        int ok = len >= 4 && l <= len - 4 && hybrid(p + 4, l, 1, bits, nv) == 0;
        for (size_t i = 0; ok && i < nv; i++) out[i].u.i = bits[i];
        free(bits);
        if (!ok) return bad(rd, c, "malformed RLE booleans");
    } else {
        char msg[80];
        snprintf(msg, sizeof msg, "encoding %d is not supported (PLAIN, dictionary and RLE booleans are)", encoding);
        return bad(rd, c, msg);
    }
    c->nv += nv;
    return AT_OK;
}

static at_status data_page(reader *rd, column *c, const pq_chunk *k, const pq_page *pg, const uint8_t *body)
{
    size_t n = (size_t)pg->num_values;
    if (n > rd->entries_left) {
        char msg[96];
        snprintf(msg, sizeof msg, "more than %zu entries in one row group", rd->max_entries);
        return bad(rd, c, msg);
    }
    rd->entries_left -= n;
    /* +1: the arrays are never NULL, even for a page of no entries */
    if (grow((void **)&c->rep, &c->cap, c->n + n + 1, sizeof *c->rep)) return at_error(AT_ERR_NOMEM, "out of memory");
    size_t cap2 = c->cap;
    c->def = realloc(c->def, cap2 * sizeof *c->def);
    if (!c->def) return at_error(AT_ERR_NOMEM, "out of memory");
    const uint8_t *p, *end;
    if (pg->type == PQ_DATA_PAGE) {
        AT_TRY(decompress(rd, c, k->codec, body, (size_t)pg->compressed_size, (size_t)pg->uncompressed_size, &p));
        end = p + pg->uncompressed_size;
        AT_TRY(levels(rd, c, &p, end, -1, c->max_rep, c->rep + c->n, n));
        AT_TRY(levels(rd, c, &p, end, -1, c->max_def, c->def + c->n, n));
    } else { /* v2: levels uncompressed in front, then the (maybe compressed) values */
        size_t lv = (size_t)pg->rep_bytes + (size_t)pg->def_bytes;
        if (lv > (size_t)pg->compressed_size || lv > (size_t)pg->uncompressed_size)
            return bad(rd, c, "v2 page levels larger than the page");
        p = body;
        AT_TRY(levels(rd, c, &p, body + pg->rep_bytes, pg->rep_bytes, c->max_rep, c->rep + c->n, n));
        AT_TRY(levels(rd, c, &p, body + lv, pg->def_bytes, c->max_def, c->def + c->n, n));
        p = body + lv;
        size_t clen = (size_t)pg->compressed_size - lv, ulen = (size_t)pg->uncompressed_size - lv;
        AT_TRY(decompress(rd, c, pg->is_compressed ? k->codec : PQ_UNCOMPRESSED, p, clen, ulen, &p));
        end = p + ulen;
    }
    size_t nv = 0;
    for (size_t i = 0; i < n; i++) nv += c->def[c->n + i] == c->max_def;
    c->n += n;
    return values(rd, c, pg->encoding, p, end, nv);
}

static at_status dict_page(reader *rd, column *c, const pq_chunk *k, const pq_page *pg, const uint8_t *body)
{
    const uint8_t *p;
    if (c->dict) return bad(rd, c, "a second dictionary page");
    if (pg->encoding != PQ_PLAIN && pg->encoding != PQ_PLAIN_DICTIONARY) return bad(rd, c, "dictionary not PLAIN");
    AT_TRY(decompress(rd, c, k->codec, body, (size_t)pg->compressed_size, (size_t)pg->uncompressed_size, &p));
    size_t n = (size_t)pg->num_values;
    if (n > (size_t)pg->uncompressed_size * 8 + 1 || n > rd->entries_left)
        return bad(rd, c, "dictionary larger than its page or the row group's bound");
    rd->entries_left -= n;
    c->dict = malloc((n ? n : 1) * sizeof *c->dict);
    if (!c->dict) return at_error(AT_ERR_NOMEM, "out of memory");
    c->n_dict = n;
    if (plain(c, p, (size_t)pg->uncompressed_size, c->dict, n)) return bad(rd, c, "dictionary values cut short");
    return AT_OK;
}

/* Decodes one column chunk's pages into c. */
static at_status read_chunk(reader *rd, column *c, const uint8_t *data, const pq_chunk *k)
{
    const uint8_t *p = data + k->start, *end = p + k->size;
    int64_t seen = 0;
    while (p < end && seen < k->num_values) {
        pq_page pg;
        size_t hl;
        AT_TRY(pq_page_header(p, (size_t)(end - p), rd->name, &pg, &hl));
        p += hl;
        if ((size_t)pg.compressed_size > (size_t)(end - p)) return bad(rd, c, "page runs past its column chunk");
        if (pg.type == PQ_DATA_PAGE || pg.type == PQ_DATA_PAGE_V2) {
            AT_TRY(data_page(rd, c, k, &pg, p));
            seen += pg.num_values;
        } else if (pg.type == PQ_DICTIONARY_PAGE) {
            AT_TRY(dict_page(rd, c, k, &pg, p));
        } /* index pages and unknown kinds are skipped */
        p += pg.compressed_size;
    }
    if (seen != k->num_values) return bad(rd, c, "fewer values in the pages than in the footer");
    return AT_OK;
}

/* ---- assembly ---- */

static cJSON *make_value(const column *c, const pq_value *v, int *bad_utf8)
{
    switch (c->type) {
    case PQ_BOOLEAN: return cJSON_CreateBool((int)v->u.i);
    case PQ_INT32:
    case PQ_INT64: return cJSON_CreateNumber((double)v->u.i);
    case PQ_FLOAT:
    case PQ_DOUBLE: return cJSON_CreateNumber(v->u.f);
    case PQ_BYTE_ARRAY:
    case PQ_FIXED: {
        if (at_utf8_check((const char *)v->s, v->len) != v->len || memchr(v->s, 0, v->len)) {
            *bad_utf8 = 1;
            return cJSON_CreateNull();
        }
        char *s = malloc((size_t)v->len + 1);
        if (!s) return NULL;
        memcpy(s, v->s, v->len);
        s[v->len] = '\0';
        cJSON *j = cJSON_CreateString(s);
        free(s);
        return j;
    }
    default: return cJSON_CreateNull(); /* INT96 timestamps */
    }
}

static cJSON *make_container(const column *c, int next)
{
    if (next >= c->n_steps) return NULL;
    return c->steps[next].kind == STEP_FIELD ? cJSON_CreateObject() : cJSON_CreateArray();
}

/* The value that ends a path: *v (taken over) or null when absent. */
static cJSON *leaf(cJSON **v)
{
    cJSON *x = *v ? *v : cJSON_CreateNull();
    *v = NULL;
    return x;
}

/* Places one entry (r, d, value or NULL) into root. -1: levels inconsistent
 * with the schema; -2: out of memory. Takes ownership of v. */
static int place(const column *c, cJSON *root, uint32_t r, uint32_t d, cJSON *v)
{
    cJSON *cur = root;
    for (int i = 0; i < c->n_steps; i++) {
        const step *s = &c->steps[i];
        int last = i + 1 == c->n_steps;
        cJSON *x = NULL;
        if (s->kind == STEP_FIELD) {
            if (!cJSON_IsObject(cur)) goto bad;
            int stop = last || d < s->null_below;
            x = cJSON_GetObjectItemCaseSensitive(cur, s->name);
            if (x) {
                if (stop || cJSON_IsNull(x)) goto bad; /* a second value for one place */
            } else {
                x = d < s->null_below ? cJSON_CreateNull() : last ? leaf(&v) : make_container(c, i + 1);
                if (!x) goto nomem;
                cJSON_AddItemToObject(cur, s->name, x);
                if (stop) break;
            }
        } else {
            if (!cJSON_IsArray(cur)) goto bad;
            if (d < s->empty_below) break; /* an empty (or, above, null) list */
            if (s->rep < r) { /* continue the last element */
                x = cur->child ? cur->child->prev : NULL;
                if (!x || last || cJSON_IsNull(x)) goto bad;
            } else {
                int stop = last || d < s->elem_null_below;
                x = d < s->elem_null_below ? cJSON_CreateNull() : last ? leaf(&v) : make_container(c, i + 1);
                if (!x) goto nomem;
                cJSON_AddItemToArray(cur, x);
                if (stop) break;
            }
        }
        cur = x;
    }
    cJSON_Delete(v);
    return 0;
bad:
    cJSON_Delete(v);
    return -1;
nomem:
    cJSON_Delete(v);
    return -2;
}

/* Moves src's content into dst: keys of objects, elements of arrays pairwise. */
static void merge(cJSON *dst, cJSON *src)
{
    if (cJSON_IsObject(dst) && cJSON_IsObject(src)) {
        while (src->child) {
            cJSON *it = cJSON_DetachItemViaPointer(src, src->child);
            cJSON *have = cJSON_GetObjectItemCaseSensitive(dst, it->string);
            if (!have) {
                cJSON_AddItemToArray(dst, it); /* keeps it->string: objects are lists too */
            } else {
                merge(have, it);
                cJSON_Delete(it);
            }
        }
    } else if (cJSON_IsArray(dst) && cJSON_IsArray(src)) {
        for (cJSON *a = dst->child, *b = src->child; a && b; a = a->next, b = b->next) merge(a, b);
    }
}

static at_status row_group(reader *rd, const uint8_t *data, int g, size_t *row_no, at_record_fn on_record,
                           at_record_issue_fn on_issue, void *ctx)
{
    at_status st = AT_OK;
    const pq_meta *m = &rd->meta;
    cJSON *row = NULL, *tree = NULL;
    rd->entries_left = rd->max_entries;
    for (int j = 0; j < m->n_leaves; j++) {
        column *c = &rd->cols[j];
        c->n = c->nv = c->pos = c->vpos = 0;
        free(c->dict);
        c->dict = NULL;
        c->n_dict = 0;
        AT_CHECK(read_chunk(rd, c, data, &m->chunks[(size_t)g * (size_t)m->n_leaves + (size_t)j]));
        if (c->n && c->rep[0] != 0) {
            st = bad(rd, c, "first entry of a row group continues a row");
            goto done;
        }
    }
    for (;;) {
        if (!rd->cols[0].n || rd->cols[0].pos >= rd->cols[0].n) break;
        row = cJSON_CreateObject();
        if (!row) goto nomem;
        int bad_utf8 = 0;
        for (int j = 0; j < m->n_leaves; j++) {
            column *c = &rd->cols[j];
            if (c->pos >= c->n) {
                st = bad(rd, c, "fewer rows than the first column");
                goto done;
            }
            tree = cJSON_CreateObject();
            if (!tree) goto nomem;
            do {
                uint32_t d = c->def[c->pos], r = c->rep[c->pos];
                cJSON *v = NULL;
                if (d == c->max_def) {
                    v = make_value(c, &c->vals[c->vpos++], &bad_utf8);
                    if (!v) goto nomem;
                }
                int pr = place(c, tree, r, d, v);
                if (pr == -2) goto nomem;
                if (pr < 0) {
                    st = bad(rd, c, "levels do not fit the schema");
                    goto done;
                }
                c->pos++;
            } while (c->pos < c->n && c->rep[c->pos] != 0);
            merge(row, tree);
            cJSON_Delete(tree);
            tree = NULL;
        }
        ++*row_no;
        if (bad_utf8) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s:%zu: invalid UTF-8 (or a NUL byte) in a string column", rd->name, *row_no);
            st = on_issue ? on_issue(ctx, AT_ISSUE_UTF8, (int)*row_no, msg) : at_error(AT_ERR_FORMAT, "%s", msg);
        } else {
            at_record rec = {rd->name, (int)*row_no, row, NULL, 0};
            st = on_record(ctx, &rec);
        }
        cJSON_Delete(row);
        row = NULL;
        if (st != AT_OK) goto done;
    }
    for (int j = 1; j < m->n_leaves; j++)
        if (rd->cols[j].pos != rd->cols[j].n) {
            st = bad(rd, &rd->cols[j], "more rows than the first column");
            goto done;
        }
done:
    cJSON_Delete(row);
    cJSON_Delete(tree);
    for (size_t i = 0; i < rd->n_bufs; i++) free(rd->bufs[i]);
    rd->n_bufs = 0;
    return st;
nomem:
    st = at_error(AT_ERR_NOMEM, "%s: out of memory assembling rows", rd->name);
    goto done;
}

at_status at_parquet_read_mem(const uint8_t *data, size_t len, const char *name, at_record_fn on_record,
                              at_record_issue_fn on_issue, void *ctx)
{
    return at_parquet_read_limited(data, len, name, AT_PARQUET_MAX_ENTRIES, on_record, on_issue, ctx);
}

at_status at_parquet_read_limited(const uint8_t *data, size_t len, const char *name, size_t max_entries,
                                  at_record_fn on_record, at_record_issue_fn on_issue, void *ctx)
{
    at_status st = AT_OK;
    reader rd = {0};
    rd.name = name;
    rd.max_entries = max_entries;
    size_t row_no = 0;
    AT_CHECK(pq_meta_read(data, len, name, &rd.meta));
    rd.cols = calloc((size_t)rd.meta.n_leaves + 1, sizeof *rd.cols);
    if (!rd.cols) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int j = 0; j < rd.meta.n_leaves; j++) plan_column(&rd.meta, &rd.cols[j], rd.meta.leaves[j]);
    for (int g = 0; g < rd.meta.n_groups; g++) AT_CHECK(row_group(&rd, data, g, &row_no, on_record, on_issue, ctx));
done:
    for (int j = 0; rd.cols && j < rd.meta.n_leaves; j++) {
        free(rd.cols[j].rep);
        free(rd.cols[j].def);
        free(rd.cols[j].vals);
        free(rd.cols[j].dict);
    }
    free(rd.cols);
    free(rd.bufs);
    pq_meta_free(&rd.meta);
    return st;
}
