#include "train/vlm_step.h"

#include <stdlib.h>
#include <string.h>

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
    int64_t sh[2] = {n_tok, d->cfg.hidden_size};
    if (vc->out_hidden_size != d->cfg.hidden_size) {
        st = at_error(AT_ERR_INVALID, "vision step: the merger gives %d features a token, the language model takes %d",
                      vc->out_hidden_size, d->cfg.hidden_size);
        goto done;
    }
    AT_CHECK(at_tensor_new(d->be, AT_F32, 2, sh, "image features", &feats));
    if (train) AT_CHECK(at_tensor_new(d->be, AT_F32, 2, sh, "d image features", &dfeats));
    AT_CHECK(at_vision_forward(v, feats, im->pixels, im->n_patches, im->grid_thw, im->n_images, train));
    fo.features = feats;
    fo.host_ids = host_ids;
    fo.feature_token = im->image_token_id;
    fo.d_features = dfeats;
    AT_CHECK(at_decoder_forward_backward_opts(d, acts, ids, pos, segments, labels, &fo, grad_scale, g, stats));
    if (train) AT_CHECK(at_vision_backward(v, dfeats));
done:
    if (train) at_vision_release(v);
    at_tensor_free(feats);
    at_tensor_free(dfeats);
    return st;
}
