/* safetensors files (https://github.com/huggingface/safetensors), read and
 * written.
 *
 * Layout: u64 little-endian N, then N bytes of JSON header
 *   {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]},
 *    ..., "__metadata__": {"key": "value", ...}}
 * then the data area; offsets are relative to the start of the data area.
 *
 * Reading maps the file (zero-copy: a tensor whose stored dtype is the one
 * asked for is an at_tensor wrapping the mapped bytes) and validates everything
 * a hostile file could lie about: sizes, offsets, overlaps, duplicate names,
 * dtypes, shapes. Every message names the file and the tensor.
 *
 * A "model" (at_st_model) is one file or a sharded Hugging Face folder
 * (model.safetensors.index.json with its weight_map); tensors are looked up
 * by name across the shards. */
#ifndef AT_MODEL_SAFETENSORS_H
#define AT_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "device/dtype.h"
#include "device/tensor.h"

#define AT_ST_MAX_DIMS 8         /* more is refused as a format error */
#define AT_ST_MAX_HEADER (100u << 20) /* a header over 100 MB is refused */

/* Pass as want_dtype to keep the stored dtype. */
#define AT_ST_KEEP_DTYPE AT_DTYPE_COUNT

/* One tensor of a file, as its header describes it (validated). Pointers are
 * owned by the file object and valid until it is closed. */
typedef struct at_st_info {
    const char *name;
    const char *dtype_name;   /* as stored: "F32", "BF16", "I64", "F8_E4M3"... */
    int has_dtype;            /* the stored dtype has an at_dtype (F32, BF16, F16, I32) */
    at_dtype dtype;           /* valid when has_dtype */
    size_t elem_size;         /* bytes per element of the stored dtype */
    int ndim;                 /* 0 for a scalar */
    int64_t shape[AT_ST_MAX_DIMS];
    const uint8_t *data;      /* first byte, inside the file's bytes (may be unaligned) */
    size_t nbytes;
    int shard;                /* index of the file in a model (0 for a single file) */
} at_st_info;

/* ---- one file ---------------------------------------------------------- */

typedef struct at_st_file at_st_file;

/* Parses a safetensors image in memory. The bytes are not copied: `data` must
 * stay valid and unchanged until at_st_close. `what` names it in messages.
 * Caller closes *out with at_st_close. This is what the fuzzer drives. */
at_status at_st_parse(const void *data, size_t size, const char *what, at_st_file **out);

/* Maps `path` read-only and parses it. Caller closes *out with at_st_close. */
at_status at_st_open(const char *path, at_st_file **out);

void at_st_close(at_st_file *f); /* NULL ok */

/* Tensors in the order of their data offsets. */
size_t at_st_count(const at_st_file *f);
const at_st_info *at_st_info_at(const at_st_file *f, size_t i);
/* NULL when absent. */
const at_st_info *at_st_find(const at_st_file *f, const char *name);

/* "__metadata__" entries (string -> string). at_st_metadata returns NULL when
 * the key is absent. Strings are owned by f. */
size_t at_st_metadata_count(const at_st_file *f);
void at_st_metadata_at(const at_st_file *f, size_t i, const char **key, const char **value);
const char *at_st_metadata(const at_st_file *f, const char *key);

/* The whole file's bytes (the mapping) and the data area's first byte. */
const uint8_t *at_st_bytes(const at_st_file *f, size_t *size);

/* Makes an at_tensor of one tensor:
 *  - want_dtype == AT_ST_KEEP_DTYPE or the stored dtype, and the bytes are
 *    aligned for the type: zero-copy, a CPU tensor wrapping the file's bytes
 *    (READ-ONLY memory: never write through it; the file must outlive it);
 *  - otherwise a new CPU tensor owning its buffer, converted: F32, BF16, F16
 *    to any of these (round to nearest even), I32 to I32.
 * A scalar (ndim 0) becomes a tensor of shape [1]; more than AT_MAX_DIMS (4)
 * dimensions is refused. Caller frees *out with at_tensor_free. */
at_status at_st_tensor(const at_st_info *info, at_dtype want_dtype, at_tensor **out);

/* The n values of a float tensor (F32, BF16, F16), of any number of
 * dimensions, as f32 into dst (the caller's). Another dtype is
 * AT_ERR_UNSUPPORTED, another count AT_ERR_FORMAT, both naming the tensor. */
at_status at_st_read_f32(const at_st_info *info, float *dst, size_t n);

/* ---- a model: one file or a sharded folder ------------------------------ */

typedef struct at_st_model at_st_model;

/* Opens `path`:
 *  - a folder: model.safetensors.index.json (its "weight_map": name -> shard
 *    file) when present, else model.safetensors, else the only *.safetensors
 *    file there (more than one without an index is an error);
 *  - a *.safetensors.index.json file: that index, shards beside it;
 *  - any other file: a single safetensors file.
 * Every shard is mapped and validated; a name in two shards, or a weight_map
 * entry whose tensor is missing from its shard, is an error.
 * Caller closes *out with at_st_model_close. */
at_status at_st_model_open(const char *path, at_st_model **out);

void at_st_model_close(at_st_model *m); /* NULL ok */

/* All tensors of all shards (shard by shard, then by offset). */
size_t at_st_model_count(const at_st_model *m);
const at_st_info *at_st_model_info_at(const at_st_model *m, size_t i);
/* NULL when absent. */
const at_st_info *at_st_model_find(const at_st_model *m, const char *name);
size_t at_st_model_shard_count(const at_st_model *m);
const at_st_file *at_st_model_shard(const at_st_model *m, size_t i);

/* Gets tensor `name` as at_st_tensor does (zero-copy when possible). When
 * expected_shape is non-NULL the tensor must have exactly ndim dimensions of
 * those sizes. A missing tensor is AT_ERR_NOT_FOUND and a mis-shaped one
 * AT_ERR_FORMAT, both with a message naming the tensor, the expected shape
 * and (when mis-shaped) the stored one. Caller frees *out with at_tensor_free;
 * m must outlive it. */
at_status at_st_get(const at_st_model *m, const char *name, int ndim, const int64_t *expected_shape,
                    at_dtype want_dtype, at_tensor **out);

/* ---- writing ------------------------------------------------------------ */

typedef struct {
    const char *key;
    const char *value;
} at_st_kv;

/* Writes n tensors (host or device: device tensors are downloaded) to `path`
 * in safetensors format, atomically (temporary file beside it, fsync,
 * rename, fsync of the folder). Names are names[i] when names is non-NULL,
 * else tensors[i]->name; duplicates are refused. Dtypes F32, BF16, F16, I32
 * (quantized tensors are refused). The header is padded with spaces to a
 * multiple of 8 bytes; spans are contiguous (as the reference library
 * requires), 4-byte types first so every tensor is aligned for its type.
 * metadata (n_meta pairs, may be NULL) becomes "__metadata__". */
at_status at_safetensors_write(const char *path, const at_tensor *const *tensors, const char *const *names,
                               size_t n, const at_st_kv *metadata, size_t n_meta);

/* The shape a tensor is written under when it is not the tensor's own (same
 * number of elements): a Conv3d weight of 5 dimensions held as a matrix. */
typedef struct {
    int ndim; /* 0: the tensor's own shape */
    int64_t shape[AT_ST_MAX_DIMS];
} at_st_shape;

/* at_safetensors_write, tensor i written with shape shapes[i] when shapes is
 * non-NULL and shapes[i].ndim > 0 (a different element count is refused). */
at_status at_safetensors_write_shaped(const char *path, const at_tensor *const *tensors, const char *const *names,
                                      const at_st_shape *shapes, size_t n, const at_st_kv *metadata, size_t n_meta);

#endif
