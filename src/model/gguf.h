/* GGUF files (llama.cpp's format, versions 2 and 3), read and written.
 *
 * Layout (little-endian):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { string key, u32 type, value },
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset },
 *   padding to `general.alignment` (u32, default 32), then the data area;
 *   each tensor's offset is relative to the data area and a multiple of the
 *   alignment. A string is u64 length + bytes (no NUL). An array is u32
 *   element type + u64 count + elements (arrays of arrays are allowed).
 *
 * Dimensions: ne[0] is the innermost (row length), i.e. the REVERSE of a
 * PyTorch shape: a [rows, cols] matrix has ne = {cols, rows}. The at_tensor
 * made from a GGUF tensor has the PyTorch order.
 *
 * Reading maps the file and validates everything a hostile file could lie
 * about (magic, version, counts, string lengths, nesting, tensor extents,
 * alignment, overlaps, duplicates, types); messages name the file, the key or
 * the tensor. Values are decoded once into an owned tree. */
#ifndef AT_MODEL_GGUF_H
#define AT_MODEL_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "device/dtype.h"
#include "device/tensor.h"

#define AT_GGUF_DEFAULT_ALIGNMENT 32
#define AT_GGUF_MAX_DIMS 4
#define AT_GGUF_MAX_DEPTH 8 /* array nesting refused beyond this */

/* Metadata value types (gguf.h numbering). */
typedef enum {
    AT_GGUF_UINT8 = 0,
    AT_GGUF_INT8 = 1,
    AT_GGUF_UINT16 = 2,
    AT_GGUF_INT16 = 3,
    AT_GGUF_UINT32 = 4,
    AT_GGUF_INT32 = 5,
    AT_GGUF_FLOAT32 = 6,
    AT_GGUF_BOOL = 7,
    AT_GGUF_STRING = 8,
    AT_GGUF_ARRAY = 9,
    AT_GGUF_UINT64 = 10,
    AT_GGUF_INT64 = 11,
    AT_GGUF_FLOAT64 = 12,
    AT_GGUF_TYPE_COUNT
} at_gguf_type;

/* Tensor types (ggml.h numbering). The reader knows the sizes of these; the
 * ones with an at_dtype (F32, F16, BF16, Q8_0, Q4_0) can become at_tensors. */
typedef enum {
    AT_GGML_F32 = 0,
    AT_GGML_F16 = 1,
    AT_GGML_Q4_0 = 2,
    AT_GGML_Q4_1 = 3,
    AT_GGML_Q5_0 = 6,
    AT_GGML_Q5_1 = 7,
    AT_GGML_Q8_0 = 8,
    AT_GGML_Q8_1 = 9,
    AT_GGML_Q2_K = 10,
    AT_GGML_Q3_K = 11,
    AT_GGML_Q4_K = 12,
    AT_GGML_Q5_K = 13,
    AT_GGML_Q6_K = 14,
    AT_GGML_Q8_K = 15,
    AT_GGML_IQ4_NL = 20,
    AT_GGML_IQ4_XS = 23,
    AT_GGML_I8 = 24,
    AT_GGML_I16 = 25,
    AT_GGML_I32 = 26,
    AT_GGML_I64 = 27,
    AT_GGML_F64 = 28,
    AT_GGML_BF16 = 30
} at_ggml_type;

/* "F32", "Q4_K"...; "?" for a type the reader does not know. */
const char *at_ggml_type_name(uint32_t type);
/* Elements per block and bytes per block; 0 for an unknown type. */
size_t at_ggml_block_elems(uint32_t type);
size_t at_ggml_block_bytes(uint32_t type);
/* The ggml type of an at_dtype (F32, F16, BF16, Q8_0, Q4_0, I32); -1 when none. */
int at_ggml_from_dtype(at_dtype t);
/* The at_dtype of a ggml type; -1 when none. */
int at_ggml_to_dtype(uint32_t type);

/* A metadata value. Scalars are in the union; a string points at `len` bytes
 * followed by a NUL (the bytes may themselves contain NULs). An array has an
 * element type and a count; numeric/bool elements are packed little-endian in
 * `raw` (possibly unaligned: read them with at_gguf_value_elem), string and
 * array elements are values in `items`. All memory is owned by the at_gguf
 * (or, for values built by a caller for the writer, by that caller). */
typedef struct at_gguf_value {
    at_gguf_type type;
    union {
        uint64_t u;   /* UINT8/16/32/64 */
        int64_t i;    /* INT8/16/32/64 */
        double f;     /* FLOAT32/64 */
        int b;        /* BOOL */
        struct {
            const char *s;
            size_t len;
        } str;
        struct {
            at_gguf_type type; /* element type */
            size_t count;
            const uint8_t *raw;                /* numeric and bool elements */
            const struct at_gguf_value *items; /* string and array elements */
        } arr;
    } v;
} at_gguf_value;

/* Element i of an array as a value (a scalar decoded from raw, or a copy of
 * items[i]). AT_ERR_INVALID when v is not an array or i is out of range. */
at_status at_gguf_value_elem(const at_gguf_value *arr, size_t i, at_gguf_value *out);
/* Conversions of one value (AT_ERR_FORMAT, no message, when the type does not
 * fit: *_int takes any integer type that fits an int64, *_uint any
 * non-negative integer, *_float any float or integer type). */
at_status at_gguf_value_int(const at_gguf_value *v, int64_t *out);
at_status at_gguf_value_uint(const at_gguf_value *v, uint64_t *out);
at_status at_gguf_value_float(const at_gguf_value *v, double *out);
/* "uint8", "string", "array"... */
const char *at_gguf_type_name(at_gguf_type t);

/* A tensor's description. ne[] beyond n_dims is 1. data points into the
 * mapping (aligned as the file says, i.e. to `alignment` from the mapping's
 * start, which mmap aligns to a page). */
typedef struct at_gguf_tensor_info {
    const char *name;
    int n_dims;
    int64_t ne[AT_GGUF_MAX_DIMS];
    uint32_t type;        /* at_ggml_type */
    uint64_t offset;      /* relative to the data area */
    const uint8_t *data;
    size_t nbytes;
} at_gguf_tensor_info;

/* ---- reading ------------------------------------------------------------ */

typedef struct at_gguf at_gguf;

/* Parses a GGUF image in memory; the bytes are not copied and must outlive
 * *out. `what` names it in messages. Caller closes with at_gguf_close. */
at_status at_gguf_parse(const void *data, size_t size, const char *what, at_gguf **out);
/* Maps `path` and parses it. Caller closes with at_gguf_close. */
at_status at_gguf_open(const char *path, at_gguf **out);
void at_gguf_close(at_gguf *g); /* NULL ok */

uint32_t at_gguf_version(const at_gguf *g);
size_t at_gguf_alignment(const at_gguf *g);
size_t at_gguf_data_offset(const at_gguf *g); /* file offset of the data area */

/* Metadata, in file order. */
size_t at_gguf_kv_count(const at_gguf *g);
const char *at_gguf_kv_key(const at_gguf *g, size_t i);
const at_gguf_value *at_gguf_kv_value(const at_gguf *g, size_t i);
/* NULL when absent. */
const at_gguf_value *at_gguf_get(const at_gguf *g, const char *key);

/* Typed getters by key: AT_OK and *out set; AT_ERR_NOT_FOUND (no message)
 * when absent; AT_ERR_FORMAT with a message naming the key when the value has
 * another type (the integer getters take any integer type whose value fits). */
at_status at_gguf_get_int(const at_gguf *g, const char *key, int64_t *out);
at_status at_gguf_get_uint(const at_gguf *g, const char *key, uint64_t *out);
at_status at_gguf_get_float(const at_gguf *g, const char *key, double *out); /* float32/64 (or integer) */
at_status at_gguf_get_bool(const at_gguf *g, const char *key, int *out);
/* *s is NUL-terminated and owned by g; len may be NULL. */
at_status at_gguf_get_string(const at_gguf *g, const char *key, const char **s, size_t *len);
/* An array: its element type and count; element access with
 * at_gguf_value_elem on at_gguf_get(g, key). */
at_status at_gguf_get_array(const at_gguf *g, const char *key, at_gguf_type *elem_type, size_t *count);

/* Tensors, in file order. */
size_t at_gguf_tensor_count(const at_gguf *g);
const at_gguf_tensor_info *at_gguf_tensor_at(const at_gguf *g, size_t i);
/* NULL when absent. */
const at_gguf_tensor_info *at_gguf_find_tensor(const at_gguf *g, const char *name);

/* Makes an at_tensor of a tensor, shape in PyTorch order (ne reversed).
 *  - want_dtype == AT_GGUF_KEEP_DTYPE or the stored type: zero-copy, a CPU
 *    tensor wrapping the mapped bytes (READ-ONLY: never write through it; g
 *    must outlive it); types F32, F16, BF16, Q8_0, Q4_0, I32;
 *  - otherwise a new CPU tensor owning its buffer: F32/F16/BF16 converted to
 *    F32/F16/BF16, Q8_0/Q4_0 dequantized to F32/F16/BF16.
 * Caller frees *out with at_tensor_free. */
#define AT_GGUF_KEEP_DTYPE AT_DTYPE_COUNT
at_status at_gguf_tensor(const at_gguf *g, const at_gguf_tensor_info *info, at_dtype want_dtype, at_tensor **out);
/* Same by name; AT_ERR_NOT_FOUND with a message naming it when absent. */
at_status at_gguf_get_tensor(const at_gguf *g, const char *name, at_dtype want_dtype, at_tensor **out);

/* ---- writing ------------------------------------------------------------ */

typedef struct at_gguf_writer at_gguf_writer;

/* Caller frees with at_gguf_writer_free. */
at_status at_gguf_writer_new(at_gguf_writer **out);
void at_gguf_writer_free(at_gguf_writer *w); /* NULL ok */

/* Metadata in the order added; a key added twice is refused. Keys and
 * values are copied. */
at_status at_gguf_add_u8(at_gguf_writer *w, const char *key, uint8_t v);
at_status at_gguf_add_i8(at_gguf_writer *w, const char *key, int8_t v);
at_status at_gguf_add_u16(at_gguf_writer *w, const char *key, uint16_t v);
at_status at_gguf_add_i16(at_gguf_writer *w, const char *key, int16_t v);
at_status at_gguf_add_u32(at_gguf_writer *w, const char *key, uint32_t v);
at_status at_gguf_add_i32(at_gguf_writer *w, const char *key, int32_t v);
at_status at_gguf_add_u64(at_gguf_writer *w, const char *key, uint64_t v);
at_status at_gguf_add_i64(at_gguf_writer *w, const char *key, int64_t v);
at_status at_gguf_add_f32(at_gguf_writer *w, const char *key, float v);
at_status at_gguf_add_f64(at_gguf_writer *w, const char *key, double v);
at_status at_gguf_add_bool(at_gguf_writer *w, const char *key, int v);
at_status at_gguf_add_string(at_gguf_writer *w, const char *key, const char *s);
/* An array of numbers or bools: count elements of elem_type packed in host
 * order in `data` (uint8_t for BOOL). */
at_status at_gguf_add_array(at_gguf_writer *w, const char *key, at_gguf_type elem_type, const void *data,
                            size_t count);
at_status at_gguf_add_string_array(at_gguf_writer *w, const char *key, const char *const *strs, size_t count);
/* Any value tree (e.g. nested arrays, or a value read from another file:
 * copying tokenizer metadata on export). Deep-copied. */
at_status at_gguf_add_value(at_gguf_writer *w, const char *key, const at_gguf_value *v);

/* A tensor: ggml type, dims innermost first (ne), nbytes must equal the size
 * the type and dims imply. The data is NOT copied: it must stay valid until
 * at_gguf_write returns. A name added twice is refused. */
at_status at_gguf_add_tensor(at_gguf_writer *w, const char *name, uint32_t type, int n_dims, const int64_t *ne,
                             const void *data, size_t nbytes);
/* A host at_tensor (F32, F16, BF16, Q8_0, Q4_0, I32) under `name` (NULL: its
 * own name); the shape is reversed into ne. Not copied, as above. */
at_status at_gguf_add_at_tensor(at_gguf_writer *w, const char *name, const at_tensor *t);

/* Writes version 3 atomically (temporary file, fsync, rename). The alignment
 * is the u32 "general.alignment" when added (a power of two), else 32. */
at_status at_gguf_write(const at_gguf_writer *w, const char *path);

/* ---- Llama-family conventions of llama.cpp -------------------------------- */

/* Maps a GGUF tensor name to its Hugging Face name:
 *   token_embd.weight -> model.embed_tokens.weight, output_norm.weight ->
 *   model.norm.weight, output.weight -> lm_head.weight,
 *   blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm,
 *   attn_k_norm, ffn_norm, ffn_gate, ffn_down, ffn_up}.{weight,bias} ->
 *   model.layers.N.{input_layernorm, self_attn.q_proj, ..., self_attn.q_norm,
 *   self_attn.k_norm, post_attention_layernorm, mlp.gate_proj, mlp.down_proj,
 *   mlp.up_proj}.{weight,bias}.
 * Returns 1 and writes out (NUL-terminated) when mapped, 0 when the name is
 * not one of these (e.g. rope_freqs.weight) or does not fit in out_len. */
int at_gguf_name_to_hf(const char *gguf_name, char *out, size_t out_len);
/* The reverse mapping (for export). Same return convention. */
int at_gguf_name_from_hf(const char *hf_name, char *out, size_t out_len);

/* 1 when the file's q/k weights are in the interleaved RoPE order (arch
 * "llama": llama.cpp's converter permuted them) and must be turned back with
 * at_qk_permute_* (AT_QK_TO_HALVES) for the HF decoder; 0 otherwise (qwen2,
 * qwen3 keep the HF order). */
int at_gguf_qk_interleaved(const at_gguf *g);

#endif
