/* Parquet's metadata as the reader uses it (data/parquet_meta.c reads it from
 * the Thrift footer and page headers; data/parquet.c decodes pages and
 * assembles rows). Only the fields the reader needs are kept. */
#ifndef AT_DATA_PARQUET_INTERNAL_H
#define AT_DATA_PARQUET_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

enum { PQ_REQUIRED = 0, PQ_OPTIONAL = 1, PQ_REPEATED = 2 };
enum { PQ_BOOLEAN = 0, PQ_INT32, PQ_INT64, PQ_INT96, PQ_FLOAT, PQ_DOUBLE, PQ_BYTE_ARRAY, PQ_FIXED };
enum { PQ_PLAIN = 0, PQ_PLAIN_DICTIONARY = 2, PQ_RLE = 3, PQ_RLE_DICTIONARY = 8 };
enum { PQ_UNCOMPRESSED = 0, PQ_SNAPPY = 1, PQ_GZIP = 2, PQ_ZSTD = 6 };
enum { PQ_DATA_PAGE = 0, PQ_INDEX_PAGE = 1, PQ_DICTIONARY_PAGE = 2, PQ_DATA_PAGE_V2 = 3 };

#define PQ_MAX_DEPTH 32 /* schema nesting; keeps levels below 256 */

typedef struct {
    char *name;
    int type;        /* physical type; -1 for a group */
    int type_length; /* FIXED_LEN_BYTE_ARRAY */
    int repetition;  /* PQ_REQUIRED.. ; the root's is ignored */
    int num_children;
    int is_list;     /* LIST or MAP annotation (converted or logical type) */
    int parent;      /* -1 for the root */
} pq_node;

typedef struct {
    int type, codec;
    int64_t num_values;
    int64_t start, size; /* the chunk's pages: first page offset, total compressed size */
} pq_chunk;

typedef struct {
    pq_node *nodes; /* schema in file order (depth first); nodes[0] is the root */
    int n_nodes;
    int *leaves;    /* node index of each leaf column, in column order */
    int n_leaves;
    pq_chunk *chunks; /* n_groups x n_leaves */
    int n_groups;
} pq_meta;

typedef struct {
    int type;
    int32_t uncompressed_size, compressed_size;
    int32_t num_values;
    int encoding;
    /* v2 only */
    int32_t def_bytes, rep_bytes;
    int is_compressed;
} pq_page;

/* Reads the footer of data[0..len) (starts and ends with "PAR1"). *m owned by
 * the caller (pq_meta_free) even on error. */
at_status pq_meta_read(const uint8_t *data, size_t len, const char *name, pq_meta *m);
void pq_meta_free(pq_meta *m);

/* Reads a page header at p (at most avail bytes); *header_len is its size. */
at_status pq_page_header(const uint8_t *p, size_t avail, const char *name, pq_page *pg, size_t *header_len);

#endif
