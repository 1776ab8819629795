/* The export job (export_job.h). */
#include "export/export_job.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "device/cpu/cpu_backend.h"
#include "export/export_files.h"
#include "export/export_gguf.h"
#include "export/export_hf.h"
#include "export/export_vision.h"
#include "export/merge.h"
#include "model/adapter.h"
#include "model/gguf.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

const char *at_export_gguf_file_name(const at_export_args *a, at_dtype resolved, char *buf, size_t len)
{
    int adapter_only = a->adapters && !a->merge_lora;
    snprintf(buf, len, "%s-%s.gguf", adapter_only ? "adapter" : "model", at_dtype_name(resolved));
    return buf;
}

/* The folder beside a file ("." for a bare name); a new string. */
static char *dir_of(const char *path)
{
    char *d = strdup(path);
    if (!d) return NULL;
    char *slash = strrchr(d, '/');
    if (!slash) {
        free(d);
        return strdup(".");
    }
    if (slash == d) slash[1] = '\0';
    else *slash = '\0';
    return d;
}

static int has_any(const char *dir, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char *p = at_path_join(dir, names[i]);
        int e = p && at_file_exists(p);
        free(p);
        if (e) return 1;
    }
    return 0;
}

/* Whether dir holds Hugging Face tokenizer files worth copying as they are. */
static int has_hf_tokenizer(const char *dir)
{
    static const char *const one[] = {"tokenizer.json", "tokenizer.model"};
    static const char *const vm[] = {"vocab.json", "merges.txt"};
    if (has_any(dir, one, 2)) return 1;
    return has_any(dir, vm, 1) && has_any(dir, vm + 1, 1);
}

/* Whether the last component of path is exactly name: "my-tokenizer.json"
 * is not a folder's tokenizer.json, and copying that folder's would take
 * another file (or none). */
static int is_named(const char *path, const char *name)
{
    const char *slash = strrchr(path, '/');
    return strcmp(slash ? slash + 1 : path, name) == 0;
}

/* The chat template text of the tokenizer folder dir (chat_template.jinja or
 * tokenizer_config.json), or NULL; a template that does not parse is left
 * out with a warning. A new string. */
static char *folder_template(const char *dir)
{
    at_chat_template *ct = NULL;
    char *s = NULL;
    at_status st = at_chat_template_load(dir, NULL, NULL, &ct);
    if (st == AT_OK) s = strdup(at_chat_template_source(ct));
    else if (st != AT_ERR_NOT_FOUND) at_log_warn("export: chat template of %s left out: %s", dir, at_last_error());
    at_clear_error();
    at_chat_template_free(ct);
    return s;
}

/* The tokenizer and chat template a GGUF file embeds. AT_ERR_NOT_FOUND (no
 * message kept) when the file is no GGUF or has no tokenizer. */
static at_status gguf_tokenizer(const char *path, at_tokenizer **tok, char **tmpl)
{
    at_gguf *g = NULL;
    if (at_gguf_open(path, &g) != AT_OK) {
        at_clear_error();
        return AT_ERR_NOT_FOUND;
    }
    at_status st = tok ? at_export_gguf_read_tokenizer(g, tok) : AT_OK;
    const char *ct = NULL;
    if (st == AT_OK && at_gguf_get_string(g, "tokenizer.chat_template", &ct, NULL) == AT_OK && ct[0] &&
        !(*tmpl = strdup(ct)))
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
    at_gguf_close(g);
    if (st == AT_ERR_NOT_FOUND) at_clear_error();
    else if (st != AT_OK) at_error_wrap(st, "export: the tokenizer of %s", path);
    return st;
}

/* The tokenizer written beside the model must fit its vocabulary, as every
 * command that loads the pair checks (text/tokenizer.h): tok, or the
 * files of folder dir copied as they are (not checked when they do not
 * load here). */
static at_status check_vocab(const at_tokenizer *tok, const char *dir, const at_decoder_weights *w, const char *model)
{
    at_tokenizer *own = NULL;
    if (!tok && dir && at_tokenizer_load(dir, NULL, &own) == AT_OK) tok = own;
    at_clear_error();
    at_status st = tok ? at_tokenizer_check_vocab(tok, w->cfg.vocab_size, model) : AT_OK;
    at_tokenizer_free(own);
    return st;
}

/* Where an HF export takes its tokenizer from: either *copy_dir (a folder
 * whose Hugging Face tokenizer files are copied as they are; new string) or
 * *tok (a loaded tokenizer the files are written from) with *tmpl (its chat
 * template, new string or NULL), or neither (a warning: no tokenizer).
 *   --tokenizer DIR holding tokenizer.json / vocab.json+merges.txt /
 *     tokenizer.model, or --tokenizer .../tokenizer.json: copied (with the
 *     config files of its folder); any other --tokenizer: loaded;
 *   a GGUF source: its embedded tokenizer;
 *   a folder or llama2.c source: the folder's HF files, else what
 *     at_tokenizer_load reads there (encoder.json + vocab.bpe, tokenizer.bin)
 *     or the one tok*.bin.
 * The chat template of a written tokenizer: a GGUF source's, else the one of
 * the folder the tokenizer came from. */
static at_status hf_tokenizer_source(const at_export_args *a, int is_dir, const char *model_dir, char **copy_dir,
                                     at_tokenizer **tok, char **tmpl)
{
    *copy_dir = NULL;
    *tok = NULL;
    *tmpl = NULL;
    at_status st = AT_OK;
    char *bin = NULL;
    if (a->tokenizer) {
        int dir = at_is_dir(a->tokenizer);
        if (dir ? has_hf_tokenizer(a->tokenizer) : is_named(a->tokenizer, "tokenizer.json")) {
            *copy_dir = dir ? strdup(a->tokenizer) : dir_of(a->tokenizer);
            return *copy_dir ? AT_OK : at_error(AT_ERR_NOMEM, "export: out of memory");
        }
        st = at_tokenizer_load(a->tokenizer, NULL, tok);
        if (st != AT_OK) return at_error_wrap(st, "export: --tokenizer %s", a->tokenizer);
        if (is_dir || gguf_tokenizer(a->model, NULL, tmpl) != AT_OK) *tmpl = dir ? folder_template(a->tokenizer) : NULL;
        return AT_OK;
    }
    if (!is_dir) {
        st = gguf_tokenizer(a->model, tok, tmpl);
        if (st != AT_ERR_NOT_FOUND) return st;
        /* not a GGUF, or one without a tokenizer: look beside the file */
    }
    static const char *const encoder[] = {"encoder.json"};
    if (has_hf_tokenizer(model_dir)) {
        *copy_dir = strdup(model_dir);
        return *copy_dir ? AT_OK : at_error(AT_ERR_NOMEM, "export: out of memory");
    }
    if (has_any(model_dir, encoder, 1)) {
        st = at_tokenizer_load(model_dir, NULL, tok);
    } else if (at_tokenizer_find_llama2c(model_dir, &bin) == AT_OK) {
        st = at_tokenizer_load(bin, NULL, tok);
    } else {
        at_clear_error();
        at_log_warn("export: no tokenizer found for %s (pass --tokenizer): the folder will have none", a->model);
        /* a folder source may still have chat_template.jinja and the like */
        *copy_dir = is_dir ? strdup(model_dir) : NULL;
        return !is_dir || *copy_dir ? AT_OK : at_error(AT_ERR_NOMEM, "export: out of memory");
    }
    if (st != AT_OK)
        at_error_wrap(st, "export: the tokenizer in %s (pass --tokenizer to use another)", bin ? bin : model_dir);
    else
        *tmpl = folder_template(model_dir);
    free(bin);
    return st;
}

/* The tokenizer for a GGUF export from a folder or llama2.c source: the one
 * asked for, else the model folder's, else tokenizer.bin beside a llama2.c
 * file. *tok stays NULL (with a warning) when there is none at all. */
static at_status find_tokenizer(const at_export_args *a, const char *model_dir, at_tokenizer **tok, char **tdir)
{
    *tok = NULL;
    *tdir = NULL;
    if (a->tokenizer) {
        AT_TRY(at_tokenizer_load(a->tokenizer, NULL, tok));
        *tdir = at_is_dir(a->tokenizer) ? strdup(a->tokenizer) : dir_of(a->tokenizer);
        return AT_OK;
    }
    static const char *const files[] = {"tokenizer.json", "vocab.json", "encoder.json", "tokenizer.bin"};
    if (!has_any(model_dir, files, sizeof files / sizeof files[0])) {
        at_log_warn("export: no tokenizer found in %s (pass --tokenizer)", model_dir);
        return AT_OK;
    }
    at_status st = at_tokenizer_load(model_dir, NULL, tok);
    if (st != AT_OK) return at_error_wrap(st, "export: the tokenizer in %s (pass --tokenizer to use another)", model_dir);
    *tdir = strdup(model_dir);
    return AT_OK;
}

/* A reward model's score head (train/reward.h): DIR/score.safetensors when
 * there is one (*out NULL otherwise), as f32 [1, hidden]. */
static at_status load_score(const char *dir, int64_t hidden, at_tensor **out)
{
    *out = NULL;
    if (!dir || !at_is_dir(dir)) return AT_OK;
    char *p = at_path_join(dir, "score.safetensors");
    if (!p) return at_error(AT_ERR_NOMEM, "export: out of memory");
    at_status st = AT_OK;
    if (at_file_exists(p)) {
        at_st_model *m = NULL;
        int64_t shape[2] = {1, hidden};
        at_tensor *t = NULL; /* a view of the file: copied before it closes */
        st = at_st_model_open(p, &m);
        if (st == AT_OK) st = at_st_get(m, "score.weight", 2, shape, AT_F32, &t);
        if (st == AT_OK) st = at_tensor_zeros(at_cpu_backend(), AT_F32, 2, shape, "score.weight", out);
        if (st == AT_OK) st = at_tensor_upload(*out, at_tensor_data(t), at_tensor_nbytes(t));
        at_tensor_free(t);
        at_st_model_close(m);
        if (st != AT_OK) st = at_error_wrap(st, "export: %s (a reward model's score head)", p);
    }
    free(p);
    return st;
}

/* A PEFT folder's adapter_config.json and adapter_model.safetensors as they
 * are, as a new export folder out (export_files.h). */
static at_status copy_peft(const char *dir, const char *out, int overwrite)
{
    static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors"};
    char *staging = NULL;
    at_status st;
    AT_CHECK(at_export_begin(out, overwrite, &staging));
    for (size_t i = 0; i < 2; i++) {
        char *s = at_path_join(dir, files[i]), *d = at_path_join(staging, files[i]);
        st = s && d ? at_export_copy_file(s, d) : at_error(AT_ERR_NOMEM, "export: out of memory");
        free(s);
        free(d);
        if (st != AT_OK) goto done;
    }
    AT_CHECK(at_export_commit(staging, out));
done:
    if (st != AT_OK) at_export_abort(staging);
    free(staging);
    return st;
}

at_status at_export_run(const at_export_args *a)
{
    if (!a->model) return at_error(AT_ERR_INVALID, "export: --model is required");
    if (!a->output_dir) return at_error(AT_ERR_INVALID, "export: --output_dir is required");
    const char *to = a->to ? a->to : "hf";
    int gguf = !strcmp(to, "gguf");
    if (!gguf && strcmp(to, "hf") != 0)
        return at_error(AT_ERR_INVALID, "export: --to \"%s\": expected hf or gguf", to);
    if (a->merge_lora && !a->adapters) return at_error(AT_ERR_INVALID, "export: --merge_lora needs --adapters");
    if (!gguf && a->dtype != AT_DTYPE_COUNT && a->dtype != AT_F32 && a->dtype != AT_BF16 && a->dtype != AT_F16)
        return at_error(AT_ERR_INVALID, "export: Hugging Face folders are f32, bf16 or f16 (q8_0/q4_0 are for GGUF)");

    at_decoder_weights *w = NULL;
    at_adapter *ad = NULL;
    at_tokenizer *tok = NULL;
    at_chat_template *ct = NULL;
    at_gguf *src_gguf = NULL;
    at_tensor *score = NULL;
    at_export_vision *vis = NULL;
    char *mm_path = NULL, *mm_final = NULL;
    char *model_dir = NULL, *tdir = NULL, *staging = NULL, *path = NULL, *tmpl = NULL;
    at_status st;
    int is_dir = at_is_dir(a->model);
    model_dir = is_dir ? strdup(a->model) : dir_of(a->model);
    if (!model_dir) return at_error(AT_ERR_NOMEM, "export: out of memory");

    at_load_options lo = at_load_options_default();
    lo.backend = at_cpu_backend();
    lo.model_type = a->model_type;
    /* An HF export in an asked-for float type loads the weights in that type,
     * so a merge is rounded once, into the type that is stored. */
    lo.dtype = !gguf && (a->dtype == AT_F32 || a->dtype == AT_BF16 || a->dtype == AT_F16) ? a->dtype
                                                                                        : AT_LOAD_KEEP_DTYPE;
    AT_CHECK(at_decoder_weights_load(a->model, &lo, &w));
    if (a->adapters) {
        st = at_adapter_load(a->adapters, &w->cfg, at_cpu_backend(), &ad);
        if (st != AT_OK) {
            at_error_wrap(st, "export: --adapters %s", a->adapters);
            goto done;
        }
    }

    AT_CHECK(load_score(a->adapters ? a->adapters : a->model, w->cfg.hidden_size, &score));
    if (score && (gguf || (ad && !a->merge_lora))) {
        st = at_error(AT_ERR_UNSUPPORTED, "export: %s holds a reward model (score.safetensors): export it as a "
                      "Hugging Face sequence-classification folder (--to hf%s)", a->adapters ? a->adapters : a->model,
                      ad ? " --merge_lora" : "");
        goto done;
    }
    /* A vision-language folder's tower goes with a whole model (merged or
     * not): the folder read as its own family, not as --model_type's. */
    if (is_dir && !a->model_type && !(ad && !a->merge_lora)) {
        AT_CHECK(at_export_vision_load(a->model, ad ? a->adapters : NULL, ad ? ad->scale : 1.0, &vis));
        int merged = 0, replaced = 0;
        if (vis) at_export_vision_applied(vis, &merged, &replaced);
        if (merged || replaced)
            at_log_info("export: vision tower: %d LoRA pair%s merged, %d tensor%s taken from %s", merged,
                        merged == 1 ? "" : "s", replaced, replaced == 1 ? "" : "s", a->adapters);
        if (gguf && vis && at_export_vision_config(vis)->kind == AT_VISION_QWEN3_VL) {
            st = at_error(AT_ERR_UNSUPPORTED, "export: GGUF of a Qwen3-VL model (interleaved M-RoPE, deepstack "
                          "features, its tower's mmproj) is not written yet; export it with --to hf");
            goto done;
        }
    }
    if (!gguf) {
        if (ad && !a->merge_lora && at_adapter_has_tower(a->adapters)) {
            /* the tower's pairs and tensors have no at_adapter form: the folder's files as they are */
            AT_CHECK(copy_peft(a->adapters, a->output_dir, a->overwrite));
            at_log_info("export: adapter (with its vision-tower tensors) copied in PEFT format to %s", a->output_dir);
            goto done;
        }
        if (ad && !a->merge_lora) {
            AT_CHECK(at_export_peft(ad, a->output_dir, a->overwrite));
            at_log_info("export: adapter written in PEFT format to %s", a->output_dir);
            goto done;
        }
        if (ad) AT_CHECK(at_merge_lora(w, ad));
        AT_CHECK(hf_tokenizer_source(a, is_dir, model_dir, &tdir, &tok, &tmpl));
        AT_CHECK(check_vocab(tok, tdir, w, a->model));
        at_export_hf_opts ho = {
            .dtype = a->dtype,
            .max_shard_size = a->max_shard_size,
            .source_dir = is_dir ? a->model : NULL,
            .tokenizer_dir = tdir,
            .tokenizer = tok,
            .chat_template = tmpl,
            .overwrite = a->overwrite,
            .progress = a->progress,
            .score = score,
            .vision = vis,
        };
        AT_CHECK(at_export_hf(w, a->output_dir, &ho));
        goto done;
    }

    /* GGUF */
    at_dtype q = a->dtype;
    if (ad && !a->merge_lora) {
        if (q == AT_DTYPE_COUNT) q = AT_F32;
    } else if (q == AT_DTYPE_COUNT) {
        q = w->cfg.has_dtype ? w->cfg.dtype : w->layers[0].wq->dtype;
        if (q != AT_BF16 && q != AT_F16) q = AT_F32;
    }
    char fname[64];
    at_export_gguf_file_name(a, q, fname, sizeof fname);
    /* --output_dir x.gguf: that file, as llama.cpp's convert writes --outfile
     * (staged in the usual folder, then renamed over x.gguf) */
    size_t olen = strlen(a->output_dir);
    int single_file = olen > 5 && !strcmp(a->output_dir + olen - 5, ".gguf");
    if (single_file && at_is_dir(a->output_dir)) {
        st = at_error(AT_ERR_INVALID, "export: %s is a folder; a .gguf --output_dir names the file to write",
                      a->output_dir);
        goto done;
    }
    AT_CHECK(at_export_begin(a->output_dir, a->overwrite, &staging));
    if (!(path = at_path_join(staging, fname))) {
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    if (ad && !a->merge_lora) {
        if (at_adapter_has_tower(a->adapters))
            at_log_warn("export: the vision-tower tensors of %s are left out: llama.cpp's LoRA GGUF adapts the "
                        "language model only (--merge_lora writes them into the model and its mmproj file)",
                        a->adapters);
        AT_CHECK(at_export_gguf_adapter(ad, &w->cfg, path, q));
    } else {
        if (ad) AT_CHECK(at_merge_lora(w, ad));
        at_export_gguf_opts go = {.quant = q, .progress = a->progress};
        int src_is_gguf = !is_dir && at_gguf_open(a->model, &src_gguf) == AT_OK;
        at_clear_error();
        if (src_is_gguf && !a->tokenizer) {
            go.tok_gguf = src_gguf;
        } else {
            AT_CHECK(find_tokenizer(a, model_dir, &tok, &tdir));
            AT_CHECK(check_vocab(tok, NULL, w, a->model));
            go.tok = tok;
            if (tdir) {
                at_status cs = at_chat_template_load(tdir, NULL, NULL, &ct);
                if (cs == AT_OK) go.chat_template = at_chat_template_source(ct);
                else if (cs != AT_ERR_NOT_FOUND) at_log_warn("export: chat template of %s: %s", tdir, at_last_error());
                at_clear_error();
            }
        }
        const char *slash = strrchr(a->model, '/');
        char name[128];
        snprintf(name, sizeof name, "%s", slash && slash[1] ? slash + 1 : a->model);
        go.name = name;
        AT_CHECK(at_export_gguf_model(w, path, &go));
        if (vis) { /* the tower as llama.cpp's mtmd takes it: a file of its own beside the model */
            char mm[4200];
            const char *fslash = strrchr(a->output_dir, '/');
            at_export_mmproj_name(single_file ? (fslash ? fslash + 1 : a->output_dir) : fname, mm, sizeof mm);
            if (!(mm_path = at_path_join(staging, mm))) {
                st = at_error(AT_ERR_NOMEM, "export: out of memory");
                goto done;
            }
            AT_CHECK(at_export_vision_mmproj(vis, &w->cfg, mm_path, q, name));
            char *parent = single_file ? dir_of(a->output_dir) : NULL;
            mm_final = at_path_join(single_file ? parent : a->output_dir, mm);
            free(parent);
            if (!mm_final) {
                st = at_error(AT_ERR_NOMEM, "export: out of memory");
                goto done;
            }
            if (single_file && !a->overwrite && at_file_exists(mm_final)) {
                st = at_error(AT_ERR_INVALID, "export: %s exists (pass --overwrite to replace it)", mm_final);
                goto done;
            }
        }
    }
    if (single_file) {
        if (mm_path && rename(mm_path, mm_final) != 0) {
            st = at_error(AT_ERR_IO, "export: %s: cannot rename into place: %s", mm_final, strerror(errno));
            goto done;
        }
        if (rename(path, a->output_dir) != 0) {
            st = at_error(AT_ERR_IO, "export: %s: cannot rename into place: %s", a->output_dir, strerror(errno));
            goto done;
        }
        char *parent = dir_of(a->output_dir);
        st = parent ? at_fsync_dir(parent) : at_error(AT_ERR_NOMEM, "export: out of memory");
        free(parent);
        at_export_abort(staging); /* the staging folder, empty now */
        if (mm_final)
            at_log_info("export: wrote %s and the vision tower %s (llama.cpp: llama-mtmd-cli -m %s --mmproj %s)",
                        a->output_dir, mm_final, a->output_dir, mm_final);
        else
            at_log_info("export: wrote %s", a->output_dir);
        goto done;
    }
    AT_CHECK(at_export_commit(staging, a->output_dir));
    if (mm_final)
        at_log_info("export: wrote %s/%s and the vision tower %s (llama.cpp: llama-mtmd-cli -m %s/%s --mmproj %s)",
                    a->output_dir, fname, mm_final, a->output_dir, fname, mm_final);
    else
        at_log_info("export: wrote %s/%s", a->output_dir, fname);
done:
    if (st != AT_OK) at_export_abort(staging);
    free(staging);
    free(path);
    free(mm_path);
    free(mm_final);
    at_export_vision_free(vis);
    free(model_dir);
    free(tdir);
    free(tmpl);
    at_chat_template_free(ct);
    at_tokenizer_free(tok);
    at_gguf_close(src_gguf);
    at_adapter_free(ad);
    at_tensor_free(score);
    at_decoder_weights_free(w);
    return st;
}
