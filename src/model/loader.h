/* Loading a decoder's weights from any model source:
 *  - a Hugging Face folder (config.json + model.safetensors, or sharded
 *    model-*.safetensors with model.safetensors.index.json), or a
 *    *.safetensors / *.safetensors.index.json file inside one;
 *  - a GGUF file (arch llama, qwen2, qwen3, qwen2vl; q/k rows of arch llama turned
 *    back to the HF rotate_half order);
 *  - a llama2.c checkpoint (.bin).
 * The kind is found from the path (folder) and the file's first bytes ("GGUF"
 * magic; otherwise a safetensors header or a llama2.c header by extension).
 *
 * Matrices (and embeddings) keep their stored dtype or are converted to the
 * one asked for; quantized GGUF matrices (Q8_0, Q4_0) are dequantized (to
 * bf16 when keeping), except the layers' seven linear matrices when the
 * dtype is kept, no quantization is asked and the weights are not writable:
 * those stay Q8_0 / Q4_0 as stored (inference reads their blocks). Norm weights and biases are always f32. When the
 * target backend is the CPU and no conversion is needed, tensors are
 * zero-copy views of the mapped files, which stay mapped as long as the
 * weights live.
 *
 * QLoRA: with a `quant` format the seven linear matrices of every layer
 * (q, k, v, o, gate, up, down) are quantized (device/quant.h) as each layer
 * is read, and the dense copy is dropped before the next layer, so the peak
 * holds the quantized model plus one dense layer (a zero-copy view of the
 * mapped file costs no heap). Embeddings, lm_head, norms and biases stay as
 * loaded. A matrix whose rows (in_features) are not a multiple of the
 * format's block (NF4: 64, q8_0 / q4_0: 32) stays dense, with an info line:
 * the quantized matmul needs whole blocks per row. Quantized weights are
 * frozen: they serve LoRA training and inference, never full fine-tuning. */
#ifndef AT_MODEL_LOADER_H
#define AT_MODEL_LOADER_H

#include "base/status.h"
#include "device/backend.h"
#include "model/decoder.h"
#include "model/weights.h"

#define AT_LOAD_KEEP_DTYPE AT_DTYPE_COUNT

/* Formats of the frozen linear matrices. */
typedef enum { AT_QUANT_NONE = 0, AT_QUANT_NF4, AT_QUANT_Q8_0, AT_QUANT_Q4_0 } at_quant_kind;

typedef struct at_load_options {
    at_backend *backend; /* NULL: the CPU */
    at_dtype dtype;      /* AT_LOAD_KEEP_DTYPE, AT_F32, AT_BF16 or AT_F16 (matrices that stay dense) */
    int writable;        /* never zero-copy views of the (read-only) mapped files:
                            full fine-tuning writes the weights */
    at_quant_kind quant; /* AT_QUANT_NONE, or quantize the layers' linear matrices (see above);
                            refused together with writable */
    const char *model_type; /* NULL, or --model_type: the family to read the folder as (model/config.h) */
} at_load_options;

/* Default options: CPU, keep the stored dtype, no quantization. */
at_load_options at_load_options_default(void);

/* The dtype of a format (AT_NF4, AT_Q8_0, AT_Q4_0; AT_DTYPE_COUNT for none)
 * and its name ("none", "nf4", "q8_0", "q4_0"). */
at_dtype at_quant_dtype(at_quant_kind q);
const char *at_quant_name(at_quant_kind q);
/* ms-swift's --quant_bits: 0 none, 4 NF4 (bitsandbytes' QLoRA format), 8
 * q8_0. Other values: AT_ERR_INVALID with a message. */
at_status at_quant_from_bits(int bits, at_quant_kind *out);
/* "none", "nf4", "q8_0", "q4_0" (also "4", "8"); AT_ERR_INVALID otherwise. */
at_status at_quant_parse(const char *s, at_quant_kind *out);

/* What a quantization did. */
typedef struct at_quant_stats {
    int64_t params;      /* values of the matrices quantized */
    size_t bytes;        /* bytes of those matrices, quantized */
    int n_quantized;     /* matrices quantized */
    int n_dense;         /* matrices kept dense (rows not a multiple of the block) */
    int64_t dense_params;
} at_quant_stats;

/* Quantizes the seven linear matrices of every layer of w in place to
 * format q (not AT_QUANT_NONE), one matrix at a time (each dense matrix is
 * freed once its quantized copy exists), on any backend (through host
 * memory when w's backend is not the host). Matrices already quantized are
 * left as they are (counted when of format q). Rows not a multiple of the
 * block: kept dense, one info line per module. stats may be NULL. On error
 * the weights hold a mix of quantized and dense matrices, every one valid. */
at_status at_decoder_weights_quantize(at_decoder_weights *w, at_quant_kind q, at_quant_stats *stats);

/* Reads the model at `path` (see above). opt may be NULL (defaults). Caller
 * frees *out with at_decoder_weights_free. Errors name the file and the
 * tensor: a missing tensor, a wrong shape, a dtype that cannot be used. */
at_status at_decoder_weights_load(const char *path, const at_load_options *opt, at_decoder_weights **out);

/* at_decoder_weights_load then at_decoder_new. Caller frees with at_decoder_free. */
at_status at_decoder_load(const char *path, const at_load_options *opt, at_decoder **out);

#endif
