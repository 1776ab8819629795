#include "train/reward_model.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "model/safetensors.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/reward.h"

struct at_reward_model {
    at_bundle *b;
    int owns_bundle;
    at_adapter *adapter; /* the LoRA checkpoint's adapter, applied while scoring (NULL: none) */
    float *w;            /* the score head on the host [hidden] */
    int batch, context;
    pthread_mutex_t mu;
};

/* DIR/score.safetensors's head into w[hidden]; *found 0 when there is none. */
static at_status head_file(const char *dir, int64_t hidden, float *w, int *found)
{
    *found = 0;
    if (!dir || !at_is_dir(dir)) return AT_OK;
    char *p = at_path_join(dir, "score.safetensors");
    if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = AT_OK;
    if (at_file_exists(p)) {
        at_st_model *m = NULL;
        at_tensor *t = NULL;
        int64_t shape[2] = {1, hidden};
        st = at_st_model_open(p, &m);
        if (st == AT_OK) st = at_st_get(m, "score.weight", 2, shape, AT_F32, &t);
        if (st == AT_OK) memcpy(w, at_tensor_data(t), (size_t)hidden * sizeof *w);
        at_tensor_free(t);
        at_st_model_close(m);
        if (st != AT_OK) st = at_error_wrap(st, "%s (a reward model's score head)", p);
        *found = st == AT_OK;
    }
    free(p);
    return st;
}

at_status at_reward_model_attach(at_bundle *b, const char *model_path, int batch, at_reward_model **out)
{
    *out = NULL;
    const at_decoder_weights *dw = b->decoder->w;
    int64_t H = b->decoder->cfg.hidden_size;
    at_reward_model *rm = calloc(1, sizeof *rm);
    float *w = malloc((size_t)H * sizeof *w);
    if (!rm || !w) {
        free(rm);
        free(w);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    at_status st = AT_OK;
    int found = 0;
    if (dw->score) {
        if (dw->score->shape[0] != 1) {
            st = at_error(AT_ERR_INVALID, "%s: the score head has %lld labels; a reward model has one", model_path,
                          (long long)dw->score->shape[0]);
            goto done;
        }
        AT_CHECK(at_tensor_download(dw->score, w, (size_t)H * sizeof *w));
        found = 1;
    }
    for (int i = 0; !found && i < b->n_adapters; i++) {
        AT_CHECK(head_file(b->adapters[i].path, H, w, &found));
        if (found && b->n_adapters > 1) {
            st = at_error(AT_ERR_INVALID, "--adapters %s is a reward model's checkpoint: serve it as the only adapter",
                          b->adapters[i].path);
            goto done;
        }
        if (found) rm->adapter = b->adapters[i].adapter;
    }
    if (!found) AT_CHECK(head_file(model_path, H, w, &found));
    if (!found) {
        st = at_error(AT_ERR_NOT_FOUND, "%s is not a reward model (no score head: score.weight of a "
                      "sequence-classification folder, or score.safetensors of an rm checkpoint)", model_path);
        goto done;
    }
    rm->b = b;
    rm->w = w;
    rm->batch = batch > 0 ? batch : 8;
    rm->context = at_bundle_context(b, 0);
    pthread_mutex_init(&rm->mu, NULL);
    *out = rm;
    return AT_OK;
done:
    free(w);
    free(rm);
    return st;
}

at_status at_reward_model_open(const at_bundle_opts *opts, int batch, at_reward_model **out)
{
    *out = NULL;
    at_bundle *b = NULL;
    AT_TRY(at_bundle_load(opts, &b));
    at_status st = at_reward_model_attach(b, opts->model, batch, out);
    if (st != AT_OK) {
        at_bundle_free(b);
        return st;
    }
    (*out)->owns_bundle = 1;
    return AT_OK;
}

int at_reward_model_context(const at_reward_model *rm) { return rm->context; }

at_status at_reward_model_encode(const at_reward_model *rm, const cJSON *prompt, const char *reply, int32_t **ids,
                                 size_t *n)
{
    *ids = NULL;
    *n = 0;
    const at_bundle *b = rm->b;
    if (!b->tmpl)
        return at_error(AT_ERR_INVALID, "the reward model %s has no chat template to render the pair with (give "
                        "--template NAME)", b->name);
    cJSON *msgs = NULL, *a = NULL;
    at_status st = AT_OK;
    if (cJSON_IsString(prompt)) {
        msgs = cJSON_CreateArray();
        cJSON *u = cJSON_CreateObject();
        if (!msgs || !u || !cJSON_AddItemToArray(msgs, u)) {
            cJSON_Delete(u);
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (!cJSON_AddStringToObject(u, "role", "user") || !cJSON_AddStringToObject(u, "content", prompt->valuestring)) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
    } else if (cJSON_IsArray(prompt)) {
        msgs = cJSON_Duplicate(prompt, 1);
        if (!msgs) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            goto done;
        }
    } else {
        st = at_error(AT_ERR_INVALID, "the prompt is neither a string nor a list of messages");
        goto done;
    }
    a = cJSON_CreateObject();
    if (!a || !cJSON_AddStringToObject(a, "role", "assistant") || !cJSON_AddStringToObject(a, "content", reply) ||
        !cJSON_AddItemToArray(msgs, a)) {
        cJSON_Delete(a);
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    at_chat_render_opts ro = {0};
    at_chat_rendered r = {0};
    AT_CHECK(at_chat_template_render(b->tmpl, msgs, &ro, &r));
    /* the template writes the special tokens itself, as in training (train/text_pipeline.c) */
    st = at_tokenizer_encode(b->tokenizer, r.text, r.len, AT_TOK_PARSE_SPECIAL, ids, n);
    at_chat_rendered_free(&r);
    if (st == AT_OK && *n == 0) st = at_error(AT_ERR_INVALID, "the pair renders to no token");
    if (st != AT_OK) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
done:
    cJSON_Delete(msgs);
    return st;
}

/* Sequences [i0, i0 + B) right-padded into one forward. */
static at_status score_batch(at_reward_model *rm, const int32_t *const *seqs, const size_t *lens, size_t i0, size_t B,
                             double *rewards)
{
    at_decoder *d = rm->b->decoder;
    size_t T = 0, H = (size_t)d->cfg.hidden_size;
    for (size_t k = 0; k < B; k++) T = lens[i0 + k] > T ? lens[i0 + k] : T;
    int32_t *ids = calloc(B * T, sizeof *ids), *pos = malloc(B * T * sizeof *pos), *len = malloc(B * sizeof *len);
    float *h = malloc(B * H * sizeof *h);
    at_tensor *tid = NULL, *tpos = NULL;
    at_decoder_acts *acts = NULL;
    at_status st = AT_OK;
    if (!ids || !pos || !len || !h) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t k = 0; k < B; k++) {
        memcpy(ids + k * T, seqs[i0 + k], lens[i0 + k] * sizeof *ids);
        for (size_t t = 0; t < T; t++) pos[k * T + t] = (int32_t)t;
        len[k] = (int32_t)lens[i0 + k];
    }
    int64_t shape[2] = {(int64_t)B, (int64_t)T};
    AT_CHECK(at_tensor_new(d->be, AT_I32, 2, shape, "ids", &tid));
    AT_CHECK(at_tensor_new(d->be, AT_I32, 2, shape, "position_ids", &tpos));
    AT_CHECK(at_tensor_upload(tid, ids, B * T * sizeof *ids));
    AT_CHECK(at_tensor_upload(tpos, pos, B * T * sizeof *pos));
    /* no gradients: the layer inputs kept, one layer's activations shared */
    AT_CHECK(at_decoder_acts_new_ex(d, (int)B, (int)T, AT_ACTS_CHECKPOINT, &acts));
    AT_CHECK(at_decoder_forward(d, acts, tid, tpos, NULL));
    AT_CHECK(at_rm_read_rewards(acts, len, rm->w, h, rewards + i0));
done:
    at_decoder_acts_free(acts);
    at_tensor_free(tid);
    at_tensor_free(tpos);
    free(ids);
    free(pos);
    free(len);
    free(h);
    return st;
}

at_status at_reward_model_score_ids(at_reward_model *rm, const int32_t *const *seqs, const size_t *lens, size_t n,
                                    double *rewards)
{
    int32_t V = rm->b->decoder->cfg.vocab_size;
    for (size_t i = 0; i < n; i++) {
        if (lens[i] < 1 || lens[i] > (size_t)rm->context)
            return at_error(AT_ERR_INVALID, "sequence %zu has %zu tokens (1 to the model's context of %d)", i, lens[i],
                            rm->context);
        for (size_t k = 0; k < lens[i]; k++)
            if (seqs[i][k] < 0 || seqs[i][k] >= V)
                return at_error(AT_ERR_INVALID, "sequence %zu: token %zu (id %d) is outside the vocabulary of %d", i,
                                k, seqs[i][k], V);
    }
    pthread_mutex_lock(&rm->mu);
    at_decoder *d = rm->b->decoder;
    at_adapter *was = d->adapter;
    at_status st = at_decoder_set_adapter(d, rm->adapter);
    for (size_t i0 = 0; st == AT_OK && i0 < n; i0 += (size_t)rm->batch) {
        size_t B = n - i0 < (size_t)rm->batch ? n - i0 : (size_t)rm->batch;
        st = score_batch(rm, seqs, lens, i0, B, rewards);
    }
    at_status s2 = at_decoder_set_adapter(d, was);
    pthread_mutex_unlock(&rm->mu);
    return st != AT_OK ? st : s2;
}

at_status at_reward_model_score(at_reward_model *rm, const cJSON *const *prompts, const char *const *replies,
                                size_t n, double *rewards)
{
    int32_t **seqs = calloc(n ? n : 1, sizeof *seqs);
    size_t *lens = calloc(n ? n : 1, sizeof *lens);
    at_status st = seqs && lens ? AT_OK : at_error(AT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == AT_OK && i < n; i++) {
        st = at_reward_model_encode(rm, prompts[i], replies[i], &seqs[i], &lens[i]);
        if (st == AT_OK && lens[i] > (size_t)rm->context)
            st = at_error(AT_ERR_INVALID, "%zu tokens, over the model's context of %d", lens[i], rm->context);
        if (st != AT_OK) st = at_error_wrap(st, "reward model: pair %zu", i);
    }
    if (st == AT_OK) st = at_reward_model_score_ids(rm, (const int32_t *const *)seqs, lens, n, rewards);
    for (size_t i = 0; seqs && i < n; i++) free(seqs[i]);
    free(seqs);
    free(lens);
    return st;
}

void at_reward_model_free(at_reward_model *rm)
{
    if (!rm) return;
    pthread_mutex_destroy(&rm->mu);
    if (rm->owns_bundle) at_bundle_free(rm->b);
    free(rm->w);
    free(rm);
}
