/* Loading a decoder's weights from any model source:
 *  - a Hugging Face folder (config.json + model.safetensors, or sharded
 *    model-*.safetensors with model.safetensors.index.json), or a
 *    *.safetensors / *.safetensors.index.json file inside one;
 *  - a GGUF file (arch llama, qwen2, qwen3; q/k rows of arch llama turned
 *    back to the HF rotate_half order);
 *  - a llama2.c checkpoint (.bin).
 * The kind is found from the path (folder) and the file's first bytes ("GGUF"
 * magic; otherwise a safetensors header or a llama2.c header by extension).
 *
 * Matrices (and embeddings) keep their stored dtype or are converted to the
 * one asked for; quantized GGUF matrices (Q8_0, Q4_0) are dequantized (to
 * bf16 when keeping). Norm weights and biases are always f32. When the
 * target backend is the CPU and no conversion is needed, tensors are
 * zero-copy views of the mapped files, which stay mapped as long as the
 * weights live. */
#ifndef AT_MODEL_LOADER_H
#define AT_MODEL_LOADER_H

#include "base/status.h"
#include "device/backend.h"
#include "model/decoder.h"
#include "model/weights.h"

#define AT_LOAD_KEEP_DTYPE AT_DTYPE_COUNT

typedef struct at_load_options {
    at_backend *backend; /* NULL: the CPU */
    at_dtype dtype;      /* AT_LOAD_KEEP_DTYPE, AT_F32, AT_BF16 or AT_F16 */
    int writable;        /* never zero-copy views of the (read-only) mapped files:
                            full fine-tuning writes the weights */
} at_load_options;

/* Default options: CPU, keep the stored dtype. */
at_load_options at_load_options_default(void);

/* Reads the model at `path` (see above). opt may be NULL (defaults). Caller
 * frees *out with at_decoder_weights_free. Errors name the file and the
 * tensor: a missing tensor, a wrong shape, a dtype that cannot be used. */
at_status at_decoder_weights_load(const char *path, const at_load_options *opt, at_decoder_weights **out);

/* at_decoder_weights_load then at_decoder_new. Caller frees with at_decoder_free. */
at_status at_decoder_load(const char *path, const at_load_options *opt, at_decoder **out);

#endif
