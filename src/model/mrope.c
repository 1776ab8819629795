/* Multimodal RoPE position ids (see mrope.h). */
#include "model/mrope.h"

at_status at_mrope_position_ids(const at_mrope_tokens *tk, const int32_t *ids, size_t n, const int32_t (*grid_thw)[3],
                                size_t n_images, int32_t *pos, int64_t *delta)
{
    const int m = tk->spatial_merge_size;
    if (m <= 0) return at_error(AT_ERR_INVALID, "M-RoPE: spatial_merge_size %d", m);
    size_t found = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (ids[i] != tk->vision_start_token_id) continue;
        if (ids[i + 1] == tk->video_token_id)
            return at_error(AT_ERR_UNSUPPORTED, "M-RoPE: videos are not supported yet (token %zu)", i + 1);
        found += ids[i + 1] == tk->image_token_id;
    }
    if (found != n_images)
        return at_error(AT_ERR_INVALID, "M-RoPE: %zu images in the tokens, %zu image grids", found, n_images);
    int64_t next = 0; /* the next text position: the largest so far + 1 */
    size_t st = 0;
    for (size_t img = 0; img < n_images; img++) {
        size_t ed = st;
        while (ed < n && ids[ed] != tk->image_token_id) ed++;
        const int32_t t = grid_thw[img][0], h = grid_thw[img][1], w = grid_thw[img][2];
        if (t <= 0 || h <= 0 || w <= 0 || h % m || w % m)
            return at_error(AT_ERR_INVALID, "M-RoPE: image %zu has grid %d x %d x %d (h and w must be multiples of %d)",
                            img, t, h, w, m);
        const int64_t lh = h / m, lw = w / m, count = (int64_t)t * lh * lw;
        if (ed >= n || (int64_t)(n - ed) < count)
            return at_error(AT_ERR_INVALID, "M-RoPE: image %zu needs %lld tokens from position %zu, the sequence has %zu",
                            img, (long long)count, ed, n);
        for (size_t k = st; k < ed; k++) { /* the text before the image */
            int64_t p = next + (int64_t)(k - st);
            pos[k] = pos[n + k] = pos[2 * n + k] = (int32_t)p;
        }
        const int64_t base = next + (int64_t)(ed - st);
        for (int64_t k = 0; k < count; k++) {
            size_t at = ed + (size_t)k;
            if (ids[at] != tk->image_token_id)
                return at_error(AT_ERR_INVALID, "M-RoPE: image %zu ends after %lld of its %lld tokens", img,
                                (long long)k, (long long)count);
            pos[at] = (int32_t)(base + k / (lh * lw));
            pos[n + at] = (int32_t)(base + (k / lw) % lh);
            pos[2 * n + at] = (int32_t)(base + k % lw);
        }
        int64_t span = t - 1;
        if (lh - 1 > span) span = lh - 1;
        if (lw - 1 > span) span = lw - 1;
        next = base + span + 1;
        st = ed + (size_t)count;
    }
    for (size_t k = st; k < n; k++) {
        int64_t p = next + (int64_t)(k - st);
        pos[k] = pos[n + k] = pos[2 * n + k] = (int32_t)p;
    }
    if (st < n) next += (int64_t)(n - st);
    if (delta) *delta = next - (int64_t)n;
    return AT_OK;
}
