/* Parquet's footer (FileMetaData) and page headers, read from Thrift's
 * compact protocol. Field ids are parquet.thrift's. */
#include <stdlib.h>
#include <string.h>
#include "data/parquet_internal.h"
#include "data/thrift.h"

#define FOR_FIELDS(t) for (int16_t last_ = 0, id; at_thrift_field((t), &last_, &id, &ft);)

static int32_t i32(at_thrift *t)
{
    int64_t v = at_thrift_i64(t);
    if (v < INT32_MIN || v > INT32_MAX) t->err = 1;
    return (int32_t)v;
}

static int is_int(int ft) { return ft == AT_TT_I32 || ft == AT_TT_I64 || ft == AT_TT_I16 || ft == AT_TT_BYTE; }

/* LogicalType is a union: field 2 MAP, field 3 LIST. */
static int logical_is_list(at_thrift *t)
{
    int ft, list = 0;
    if (!at_thrift_enter(t)) return 0;
    FOR_FIELDS(t)
    {
        if (id == 2 || id == 3) list = 1;
        at_thrift_skip(t, ft);
    }
    at_thrift_leave(t);
    return list;
}

static void schema_element(at_thrift *t, pq_node *n)
{
    int ft;
    n->type = -1;
    if (!at_thrift_enter(t)) return;
    FOR_FIELDS(t)
    {
        if (id == 1 && is_int(ft)) n->type = i32(t);
        else if (id == 2 && is_int(ft)) n->type_length = i32(t);
        else if (id == 3 && is_int(ft)) n->repetition = i32(t);
        else if (id == 4 && ft == AT_TT_BINARY && !n->name) {
            size_t len;
            const uint8_t *s = at_thrift_binary(t, &len);
            if (s && (n->name = malloc(len + 1))) {
                memcpy(n->name, s, len);
                n->name[len] = '\0';
            } else {
                t->err = 1;
            }
        } else if (id == 5 && is_int(ft)) n->num_children = i32(t);
        else if (id == 6 && is_int(ft)) {
            int32_t c = i32(t);
            if (c == 1 || c == 2 || c == 3) n->is_list = 1; /* MAP, MAP_KEY_VALUE, LIST */
        } else if (id == 10 && ft == AT_TT_STRUCT) {
            if (logical_is_list(t)) n->is_list = 1;
        } else at_thrift_skip(t, ft);
    }
    at_thrift_leave(t);
}

static void column_meta(at_thrift *t, pq_chunk *c)
{
    int ft;
    int64_t data_off = -1, dict_off = -1;
    if (!at_thrift_enter(t)) return;
    FOR_FIELDS(t)
    {
        if (id == 1 && is_int(ft)) c->type = i32(t);
        else if (id == 4 && is_int(ft)) c->codec = i32(t);
        else if (id == 5 && is_int(ft)) c->num_values = at_thrift_i64(t);
        else if (id == 7 && is_int(ft)) c->size = at_thrift_i64(t);
        else if (id == 9 && is_int(ft)) data_off = at_thrift_i64(t);
        else if (id == 11 && is_int(ft)) dict_off = at_thrift_i64(t);
        else at_thrift_skip(t, ft);
    }
    at_thrift_leave(t);
    /* some writers set dictionary_page_offset to 0 when there is none */
    c->start = dict_off > 0 && dict_off < data_off ? dict_off : data_off;
}

static void column_chunk(at_thrift *t, pq_chunk *c, int *external)
{
    int ft;
    c->start = -1;
    if (!at_thrift_enter(t)) return;
    FOR_FIELDS(t)
    {
        if (id == 1 && ft == AT_TT_BINARY) {
            *external = 1;
            at_thrift_skip(t, ft);
        } else if (id == 3 && ft == AT_TT_STRUCT) column_meta(t, c);
        else at_thrift_skip(t, ft);
    }
    at_thrift_leave(t);
}

/* Links nodes into a tree from num_children (depth first) and lists leaves. */
static at_status build_tree(pq_meta *m, const char *name)
{
    int stack[PQ_MAX_DEPTH + 1], left[PQ_MAX_DEPTH + 1], depth = 0;
    if (m->n_nodes < 1 || m->nodes[0].num_children < 0)
        return at_error(AT_ERR_FORMAT, "%s: Parquet schema has no root", name);
    m->leaves = malloc((size_t)m->n_nodes * sizeof *m->leaves);
    if (!m->leaves) return at_error(AT_ERR_NOMEM, "out of memory");
    m->nodes[0].parent = -1;
    stack[0] = 0;
    left[0] = m->nodes[0].num_children;
    for (int i = 1; i < m->n_nodes; i++) {
        while (depth >= 0 && left[depth] == 0) depth--;
        if (depth < 0) return at_error(AT_ERR_FORMAT, "%s: Parquet schema has more elements than its tree", name);
        pq_node *n = &m->nodes[i];
        if (!n->name) return at_error(AT_ERR_FORMAT, "%s: Parquet schema element %d has no name", name, i);
        if (n->repetition < PQ_REQUIRED || n->repetition > PQ_REPEATED || n->num_children < 0)
            return at_error(AT_ERR_FORMAT, "%s: Parquet schema element '%s' is malformed", name, n->name);
        n->parent = stack[depth];
        left[depth]--;
        if (n->num_children > 0) {
            if (depth + 1 >= PQ_MAX_DEPTH)
                return at_error(AT_ERR_UNSUPPORTED, "%s: Parquet schema nested deeper than %d", name, PQ_MAX_DEPTH);
            n->type = -1;
            stack[++depth] = i;
            left[depth] = n->num_children;
        } else {
            if (n->type < PQ_BOOLEAN || n->type > PQ_FIXED)
                return at_error(AT_ERR_FORMAT, "%s: column '%s' has physical type %d", name, n->name, n->type);
            if (n->type == PQ_FIXED && n->type_length <= 0)
                return at_error(AT_ERR_FORMAT, "%s: column '%s' has no fixed length", name, n->name);
            m->leaves[m->n_leaves++] = i;
        }
    }
    for (int d = 0; d <= depth; d++)
        if (left[d]) return at_error(AT_ERR_FORMAT, "%s: Parquet schema ends inside a group", name);
    return AT_OK;
}

at_status pq_meta_read(const uint8_t *data, size_t len, const char *name, pq_meta *m)
{
    memset(m, 0, sizeof *m);
    if (len < 12 || memcmp(data, "PAR1", 4) || memcmp(data + len - 4, "PAR1", 4))
        return at_error(AT_ERR_FORMAT, "%s: not a Parquet file (no PAR1 at both ends)", name);
    uint32_t flen = (uint32_t)data[len - 8] | (uint32_t)data[len - 7] << 8 | (uint32_t)data[len - 6] << 16 |
                    (uint32_t)data[len - 5] << 24;
    if (flen > len - 12) return at_error(AT_ERR_FORMAT, "%s: Parquet footer length %u exceeds the file", name, flen);
    size_t fstart = len - 8 - flen;
    at_thrift t = {data + fstart, data + len - 8, 0, 0};
    int ft, external = 0;
    FOR_FIELDS(&t)
    {
        if (id == 2 && ft == AT_TT_LIST && !m->nodes) {
            int et;
            size_t n = at_thrift_list(&t, &et);
            if (et != AT_TT_STRUCT || n == 0 || n > 100000) {
                t.err = 1;
                break;
            }
            m->nodes = calloc(n, sizeof *m->nodes);
            if (!m->nodes) return at_error(AT_ERR_NOMEM, "out of memory");
            m->n_nodes = (int)n;
            for (size_t i = 0; i < n && !t.err; i++) schema_element(&t, &m->nodes[i]);
        } else if (id == 4 && ft == AT_TT_LIST && m->nodes && !m->chunks) {
            AT_TRY(build_tree(m, name));
            int et;
            size_t n = at_thrift_list(&t, &et);
            /* each column chunk takes bytes of the footer: bound the table by them */
            if (et != AT_TT_STRUCT || (n && !m->n_leaves) || (uint64_t)n * (uint64_t)m->n_leaves > flen) {
                t.err = 1;
                break;
            }
            m->chunks = calloc(n * (size_t)m->n_leaves + 1, sizeof *m->chunks);
            if (!m->chunks) return at_error(AT_ERR_NOMEM, "out of memory");
            m->n_groups = (int)n;
            for (size_t g = 0; g < n && !t.err; g++) {
                /* RowGroup: 1 columns */
                if (!at_thrift_enter(&t)) break;
                int ft2;
                size_t got = 0;
                for (int16_t last2 = 0, id2; at_thrift_field(&t, &last2, &id2, &ft2);) {
                    if (id2 == 1 && ft2 == AT_TT_LIST && !got) {
                        int et2;
                        size_t nc = at_thrift_list(&t, &et2);
                        if (et2 != AT_TT_STRUCT || nc != (size_t)m->n_leaves) {
                            if (!t.err)
                                return at_error(AT_ERR_FORMAT, "%s: row group %zu has %zu columns, the schema %d", name,
                                                g, nc, m->n_leaves);
                            break;
                        }
                        for (size_t c = 0; c < nc && !t.err; c++)
                            column_chunk(&t, &m->chunks[g * (size_t)m->n_leaves + c], &external);
                        got = 1;
                    } else at_thrift_skip(&t, ft2);
                }
                at_thrift_leave(&t);
                if (!got && !t.err) return at_error(AT_ERR_FORMAT, "%s: row group %zu lists no columns", name, g);
            }
        } else at_thrift_skip(&t, ft);
    }
    if (t.err) return at_error(AT_ERR_FORMAT, "%s: malformed Parquet footer", name);
    if (!m->nodes) return at_error(AT_ERR_FORMAT, "%s: Parquet footer has no schema", name);
    if (!m->leaves) AT_TRY(build_tree(m, name));
    if (external) return at_error(AT_ERR_UNSUPPORTED, "%s: column chunks in other files are not supported", name);
    for (int g = 0; g < m->n_groups; g++)
        for (int c = 0; c < m->n_leaves; c++) {
            const pq_chunk *k = &m->chunks[(size_t)g * (size_t)m->n_leaves + (size_t)c];
            if (k->start < 4 || k->size < 0 || (uint64_t)k->start > fstart || (uint64_t)k->size > fstart - (size_t)k->start)
                return at_error(AT_ERR_FORMAT, "%s: row group %d column %d lies outside the file's data", name, g, c);
            if (k->type != m->nodes[m->leaves[c]].type)
                return at_error(AT_ERR_FORMAT, "%s: column '%s' has type %d in row group %d, %d in the schema", name,
                                m->nodes[m->leaves[c]].name, k->type, g, m->nodes[m->leaves[c]].type);
            if (k->num_values < 0) return at_error(AT_ERR_FORMAT, "%s: negative value count", name);
        }
    return AT_OK;
}

void pq_meta_free(pq_meta *m)
{
    for (int i = 0; i < m->n_nodes; i++) free(m->nodes[i].name);
    free(m->nodes);
    free(m->leaves);
    free(m->chunks);
    memset(m, 0, sizeof *m);
}

static void data_page_header(at_thrift *t, pq_page *pg, int v2)
{
    int ft;
    if (!at_thrift_enter(t)) return;
    FOR_FIELDS(t)
    {
        if (id == 1 && is_int(ft)) pg->num_values = i32(t);
        else if (!v2 && id == 2 && is_int(ft)) pg->encoding = i32(t);
        else if (v2 && id == 4 && is_int(ft)) pg->encoding = i32(t);
        else if (v2 && id == 5 && is_int(ft)) pg->def_bytes = i32(t);
        else if (v2 && id == 6 && is_int(ft)) pg->rep_bytes = i32(t);
        else if (v2 && id == 7 && (ft == AT_TT_TRUE || ft == AT_TT_FALSE)) pg->is_compressed = ft == AT_TT_TRUE;
        else at_thrift_skip(t, ft);
    }
    at_thrift_leave(t);
}

at_status pq_page_header(const uint8_t *p, size_t avail, const char *name, pq_page *pg, size_t *header_len)
{
    at_thrift t = {p, p + avail, 0, 0};
    int ft;
    memset(pg, 0, sizeof *pg);
    pg->type = -1;
    pg->is_compressed = 1;
    FOR_FIELDS(&t)
    {
        if (id == 1 && is_int(ft)) pg->type = i32(&t);
        else if (id == 2 && is_int(ft)) pg->uncompressed_size = i32(&t);
        else if (id == 3 && is_int(ft)) pg->compressed_size = i32(&t);
        else if ((id == 5 || id == 7) && ft == AT_TT_STRUCT) data_page_header(&t, pg, 0); /* v1 or dictionary */
        else if (id == 8 && ft == AT_TT_STRUCT) data_page_header(&t, pg, 1);
        else at_thrift_skip(&t, ft);
    }
    if (t.err || pg->uncompressed_size < 0 || pg->compressed_size < 0 || pg->num_values < 0 || pg->def_bytes < 0 ||
        pg->rep_bytes < 0)
        return at_error(AT_ERR_FORMAT, "%s: malformed Parquet page header", name);
    *header_len = (size_t)(t.p - p);
    return AT_OK;
}
