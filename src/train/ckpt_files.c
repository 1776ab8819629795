#include "train/ckpt_files.h"

#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "base/file.h"
#include "base/log.h"
#include "text/tokenizer_hf_export.h"

/* The files of a Hugging Face tokenizer, as transformers' save_pretrained writes them. */
static const char *const tokenizer_files[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt",     "tokenizer.model",       "chat_template.jinja",     "chat_template.json",
};

at_status at_ckpt_copy_if_file(const char *dir, const char *name, const char *to)
{
    char *src = at_path_join(dir, name), *dst = at_path_join(to, name), *data = NULL;
    size_t len = 0;
    at_status st = src && dst ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
    if (st == AT_OK && at_file_exists(src) && !at_is_dir(src)) {
        st = at_read_file(src, &data, &len);
        if (st == AT_OK) st = at_write_file_atomic(dst, data, len);
    }
    free(data);
    free(src);
    free(dst);
    return st;
}

static int has_file(const char *dir, const char *name)
{
    char *p = dir ? at_path_join(dir, name) : NULL;
    int r = p && at_file_exists(p) && !at_is_dir(p);
    free(p);
    return r;
}

at_status at_ckpt_write_standalone(const char *dir, const char *tokenizer_dir, const char *model_dir,
                                   const at_tokenizer *tok, const at_chat_template *tmpl, int64_t context)
{
    if (tokenizer_dir && (has_file(tokenizer_dir, "tokenizer.json") || has_file(tokenizer_dir, "tokenizer.model"))) {
        for (size_t i = 0; i < sizeof tokenizer_files / sizeof tokenizer_files[0]; i++)
            AT_TRY(at_ckpt_copy_if_file(tokenizer_dir, tokenizer_files[i], dir));
    } else {
        at_tokenizer_hf_opts o = {.chat_template = tmpl ? at_chat_template_source(tmpl) : NULL,
                                  .model_max_length = context};
        at_status st = at_tokenizer_hf_write(tok, &o, dir);
        if (st == AT_ERR_UNSUPPORTED) { /* the weights stand; say what is missing */
            at_log_warn("%s: no tokenizer files (%s): give --tokenizer when loading it", dir, at_last_error());
            at_clear_error();
        } else if (st != AT_OK) {
            return st;
        }
    }
    if (has_file(model_dir, "generation_config.json")) return at_ckpt_copy_if_file(model_dir, "generation_config.json", dir);
    cJSON *g = cJSON_CreateObject();
    if (!g) return at_error(AT_ERR_NOMEM, "out of memory");
    if (at_tokenizer_bos(tok) >= 0) cJSON_AddNumberToObject(g, "bos_token_id", at_tokenizer_bos(tok));
    if (at_tokenizer_eos(tok) >= 0) cJSON_AddNumberToObject(g, "eos_token_id", at_tokenizer_eos(tok));
    cJSON_AddBoolToObject(g, "_from_model_config", 1);
    char *text = cJSON_Print(g), *p = at_path_join(dir, "generation_config.json");
    cJSON_Delete(g);
    at_status st = text && p ? at_write_file_atomic(p, text, strlen(text)) : at_error(AT_ERR_NOMEM, "out of memory");
    free(text);
    free(p);
    return st;
}
