/* The export job behind `anytune export`: read a model (Hugging Face folder,
 * GGUF, llama2.c), optionally a PEFT adapter, and write
 *   --to hf   + --merge_lora : the merged model as a Hugging Face folder
 *   --to hf   (adapter only) : the adapter in PEFT format
 *   --to hf   (no adapter)   : the model converted to a Hugging Face folder
 *   --to gguf + --merge_lora : the merged model as a llama.cpp GGUF
 *   --to gguf (adapter only) : a llama.cpp LoRA adapter GGUF
 *   --to gguf (no adapter)   : the model converted to GGUF
 * into the folder output_dir (staged and renamed, with MANIFEST.sha256; see
 * export_files.h). The GGUF file in it is named model-<type>.gguf or
 * adapter-<type>.gguf; an output_dir ending in ".gguf" is that file itself
 * (staged beside it and renamed into place). */
#ifndef AT_EXPORT_EXPORT_JOB_H
#define AT_EXPORT_EXPORT_JOB_H

#include <stdint.h>
#include "base/status.h"
#include "device/dtype.h"

typedef struct {
    const char *model;       /* folder, .gguf or llama2.c .bin (required) */
    const char *model_type;  /* NULL, or --model_type: the family to read the folder as (model/config.h) */
    const char *adapters;    /* PEFT adapter folder, or NULL */
    int merge_lora;
    const char *to;          /* "hf" or "gguf" */
    const char *output_dir;  /* required */
    at_dtype dtype;          /* hf: f32/bf16/f16; gguf: also q8_0/q4_0; AT_DTYPE_COUNT: the model's */
    int64_t max_shard_size;  /* hf; 0: 5 GB */
    const char *tokenizer;   /* tokenizer folder or file; NULL: beside the model */
    int overwrite;
    int progress;
} at_export_args;

/* Runs the export. Errors say which input or option is at fault. */
at_status at_export_run(const at_export_args *a);

/* The file name the GGUF export writes inside output_dir for these args
 * ("model-q8_0.gguf", "adapter-f32.gguf", ...), into buf. */
const char *at_export_gguf_file_name(const at_export_args *a, at_dtype resolved, char *buf, size_t len);

#endif
