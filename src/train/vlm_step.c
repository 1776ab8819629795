#include "train/vlm_step.h"

#include <stdlib.h>
#include <string.h>
#include "data/media.h"

at_status at_vlm_batch_positions(const at_mrope_tokens *tk, const int32_t *ids, const int32_t *segments,
                                 const int32_t *lengths, size_t rows, size_t cols, const int32_t (*grid_thw)[3],
                                 size_t n_images, int32_t *out)
{
    int32_t *cm = malloc((cols > 0 ? cols : 1) * 3 * sizeof *cm);
    if (!cm) return at_error(AT_ERR_NOMEM, "M-RoPE positions: out of memory");
    at_status st = AT_OK;
    size_t g = 0;
    memset(out, 0, rows * cols * 3 * sizeof *out);
    for (size_t r = 0; r < rows && st == AT_OK; r++) {
        const int32_t *row = ids + r * cols, *seg = segments ? segments + r * cols : NULL;
        size_t len = lengths ? (size_t)lengths[r] : cols;
        if (len > cols) len = cols;
        for (size_t s0 = 0, s1; s0 < len && st == AT_OK; s0 = s1) {
            /* one sample: the run of one segment id */
            for (s1 = s0 + 1; s1 < len && (!seg || seg[s1] == seg[s0]); s1++) {}
            size_t n = s1 - s0, ni = 0;
            for (size_t t = s0; t + 1 < s1; t++) ni += row[t] == tk->vision_start_token_id && row[t + 1] == tk->image_token_id;
            if (g + ni > n_images) {
                st = at_error(AT_ERR_INVALID, "M-RoPE positions: row %zu holds more images than the batch's %zu grids",
                              r, n_images);
                break;
            }
            st = at_mrope_position_ids(tk, row + s0, n, grid_thw + g, ni, cm, NULL);
            if (st != AT_OK) {
                at_error_wrap(st, "M-RoPE positions of row %zu, tokens %zu..%zu", r, s0, s1 - 1);
                break;
            }
            g += ni;
            for (size_t t = 0; t < n; t++)
                for (int k = 0; k < 3; k++) out[((r * cols) + s0 + t) * 3 + (size_t)k] = cm[(size_t)k * n + t];
        }
    }
    if (st == AT_OK && g != n_images)
        st = at_error(AT_ERR_INVALID, "M-RoPE positions: the batch holds %zu images, %zu grids were given", g, n_images);
    free(cm);
    return st;
}

at_status at_vlm_forward_backward(at_decoder *d, at_vision *v, at_decoder_acts *acts, const int32_t *host_ids,
                                  const at_tensor *ids, const at_tensor *pos, const at_tensor *segments,
                                  const at_tensor *labels, const at_vlm_images *im, const at_fwd_opts *o,
                                  float grad_scale, at_decoder_grads *g, at_loss_stats *stats)
{
    at_fwd_opts fo = *o;
    if (!im || im->n_images == 0)
        return at_decoder_forward_backward_opts(d, acts, ids, pos, segments, labels, &fo, grad_scale, g, stats);
    if (!v) return at_error(AT_ERR_INVALID, "vision step: the batch has images and the model no vision tower");
    if (at_vision_backend(v) != d->be)
        return at_error(AT_ERR_INVALID, "vision step: the tower is on %s, the language model on %s",
                        at_vision_backend(v)->name, d->be->name);
    at_status st = AT_OK;
    at_tensor *feats = NULL, *dfeats = NULL;
    int64_t n_tok = 0;
    const at_vision_config *vc = at_vision_get_config(v);
    /* the tower trains when one of its parts has gradients */
    int train = 0;
    for (size_t i = 0; i < at_vision_param_count(v); i++) train |= at_vision_grad(v, i) != NULL;
    train &= g != NULL;
    AT_CHECK(at_vision_tokens(vc, im->grid_thw, im->n_images, im->n_patches, &n_tok));
    /* the merger's features, then Qwen3-VL's deepstack features (n_tok rows each) */
    const int64_t rows = at_vision_feature_rows(vc, n_tok);
    const int n_ds = (int)(rows / n_tok) - 1;
    int64_t sh[2] = {rows, d->cfg.hidden_size};
    if (vc->out_hidden_size != d->cfg.hidden_size) {
        st = at_error(AT_ERR_INVALID, "vision step: the merger gives %d features a token, the language model takes %d",
                      vc->out_hidden_size, d->cfg.hidden_size);
        goto done;
    }
    AT_CHECK(at_tensor_new(d->be, AT_F32, 2, sh, "image features", &feats));
    if (train) AT_CHECK(at_tensor_new(d->be, AT_F32, 2, sh, "d image features", &dfeats));
    AT_CHECK(at_vision_forward(v, feats, im->pixels, im->n_patches, im->grid_thw, im->n_images, train));
    at_tensor f0, df0, ds, dds;
    int64_t s0[2] = {n_tok, sh[1]}, sd[2] = {rows - n_tok, sh[1]};
    at_tensor_view_inplace(&f0, feats, 0, 2, s0);
    at_tensor_view_inplace(&ds, feats, (size_t)(n_tok * sh[1]), 2, sd);
    if (dfeats) at_tensor_view_inplace(&df0, dfeats, 0, 2, s0);
    if (dfeats) at_tensor_view_inplace(&dds, dfeats, (size_t)(n_tok * sh[1]), 2, sd);
    fo.features = &f0;
    fo.host_ids = host_ids;
    fo.feature_token = im->image_token_id;
    fo.d_features = dfeats ? &df0 : NULL;
    fo.deepstack = n_ds ? &ds : NULL;
    fo.n_deepstack = n_ds;
    fo.d_deepstack = n_ds && dfeats ? &dds : NULL;
    AT_CHECK(at_decoder_forward_backward_opts(d, acts, ids, pos, segments, labels, &fo, grad_scale, g, stats));
    if (train) AT_CHECK(at_vision_backward(v, dfeats));
done:
    if (train) at_vision_release(v);
    at_tensor_free(feats);
    at_tensor_free(dfeats);
    return st;
}

at_status at_vlm_sample_loss(at_decoder *d, at_vision *v, const at_encoder *enc, const at_image_processor *proc,
                             const at_sample *s, double *loss, int64_t *n_targets)
{
    const at_vision_config *vc = v ? at_vision_get_config(v) : NULL;
    if (s->n_images && !vc) return at_error(AT_ERR_INVALID, "%s:%d: images and no vision tower", s->source, s->line);
    size_t ni = s->n_images;
    at_encoded e = {0};
    at_image_patches *pp = calloc(ni + 1, sizeof *pp);
    size_t *counts = calloc(ni + 1, sizeof *counts);
    int32_t (*grid)[3] = calloc(ni + 1, sizeof *grid);
    float *pixels = NULL;
    int32_t *mpos = NULL;
    at_decoder_acts *acts = NULL;
    at_tensor *ids = NULL, *lab = NULL, *pos = NULL;
    at_status st = AT_OK;
    int64_t n_patches = 0;
    size_t dim = 0;
    if (!pp || !counts || !grid) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < ni; i++) {
        at_image img;
        AT_CHECK(at_media_load_image(s->images[i], 0, &img));
        st = at_image_to_patches(proc, &img, s->images[i], &pp[i]);
        at_image_free(&img);
        if (st != AT_OK) goto done;
        counts[i] = at_image_patches_tokens(&pp[i], proc->merge_size);
        grid[i][0] = pp[i].grid_t;
        grid[i][1] = pp[i].grid_h;
        grid[i][2] = pp[i].grid_w;
        n_patches += (int64_t)pp[i].n_patches;
        dim = pp[i].patch_dim;
    }
    int dropped = 0;
    AT_CHECK(at_media_encode(enc, s, vc ? vc->image_token_id : -1, counts, &e, &dropped));
    if (dropped) {
        st = at_error(AT_ERR_INVALID, "%s:%d: longer than the encoder's max_length", s->source, s->line);
        goto done;
    }
    pixels = malloc(((size_t)n_patches * dim + 1) * sizeof *pixels);
    mpos = malloc(e.n * 3 * sizeof *mpos);
    if (!pixels || !mpos) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0, off = 0; i < ni; off += pp[i].n_patches * dim, i++)
        memcpy(pixels + off, pp[i].values, pp[i].n_patches * dim * sizeof *pixels);
    at_mrope_tokens tk = {vc ? vc->image_token_id : -1, vc ? vc->video_token_id : -1,
                          vc ? vc->vision_start_token_id : -1, vc ? vc->spatial_merge_size : 2};
    int32_t len = (int32_t)e.n;
    AT_CHECK(at_vlm_batch_positions(&tk, e.ids, NULL, &len, 1, e.n, (const int32_t(*)[3])grid, ni, mpos));
    int64_t sh[2] = {1, (int64_t)e.n}, sp[3] = {1, (int64_t)e.n, 3};
    AT_CHECK(at_tensor_new(d->be, AT_I32, 2, sh, "ids", &ids));
    AT_CHECK(at_tensor_new(d->be, AT_I32, 2, sh, "labels", &lab));
    AT_CHECK(at_tensor_new(d->be, AT_I32, 3, sp, "positions", &pos));
    AT_CHECK(at_tensor_upload(ids, e.ids, e.n * sizeof(int32_t)));
    AT_CHECK(at_tensor_upload(lab, e.labels, e.n * sizeof(int32_t)));
    AT_CHECK(at_tensor_upload(pos, mpos, e.n * 3 * sizeof(int32_t)));
    AT_CHECK(at_decoder_acts_new_ex(d, 1, (int)e.n, AT_ACTS_TRAIN, &acts));
    at_vlm_images im = {pixels, n_patches, (const int32_t(*)[3])grid, (int)ni, tk.image_token_id};
    at_fwd_opts fo = {0};
    at_loss_stats ls = {0};
    AT_CHECK(at_vlm_forward_backward(d, v, acts, e.ids, ids, pos, NULL, lab, &im, &fo, 1.0f, NULL, &ls));
    *loss = ls.loss_sum;
    if (n_targets) *n_targets = ls.n_targets;
done:
    at_tensor_free(ids);
    at_tensor_free(lab);
    at_tensor_free(pos);
    at_decoder_acts_free(acts);
    free(mpos);
    free(pixels);
    for (size_t i = 0; pp && i < ni; i++) at_image_patches_free(&pp[i]);
    free(pp);
    free(counts);
    free(grid);
    at_encoded_free(&e);
    return st;
}
