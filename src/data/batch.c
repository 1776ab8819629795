#include "data/batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/rng.h"
#include "data/media.h"

/* Sort helpers: qsort is not stable, so ties are broken by the index. */
typedef struct {
    size_t len, idx, key; /* key: tie-breaker (position after a shuffle) */
} len_item;

static int by_len_desc(const void *a, const void *b)
{
    const len_item *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->key < y->key ? -1 : x->key > y->key ? 1 : 0;
}

static void shuffle_idx(at_rng *r, size_t *idx, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)at_rng_below(r, i);
        size_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

at_status at_pack_ffd(const size_t *lengths, size_t n, size_t capacity, size_t *bin_of, size_t *n_bins)
{
    at_status st = AT_OK;
    len_item *it = malloc((n ? n : 1) * sizeof *it);
    size_t *room = malloc((n ? n : 1) * sizeof *room);
    *n_bins = 0;
    if (!it || !room) {
        st = at_error(AT_ERR_NOMEM, "out of memory packing");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (lengths[i] == 0 || lengths[i] > capacity) {
            st = at_error(AT_ERR_INVALID, "sample %zu has %zu tokens; packing needs 1..%zu (truncate first)", i,
                          lengths[i], capacity);
            goto done;
        }
        it[i] = (len_item){lengths[i], i, i};
    }
    qsort(it, n, sizeof *it, by_len_desc);
    /* First fit over the open rows. O(n * rows): fine for the tens of
     * thousands of samples a fine-tuning set has. */
    size_t nb = 0;
    for (size_t k = 0; k < n; k++) {
        size_t b = 0;
        while (b < nb && room[b] < it[k].len) b++;
        if (b == nb) room[nb++] = capacity;
        room[b] -= it[k].len;
        bin_of[it[k].idx] = b;
    }
    *n_bins = nb;
done:
    free(it);
    free(room);
    return st;
}

void at_batch_plan_free(at_batch_plan *p)
{
    if (!p) return;
    free(p->batch_start);
    free(p->row_start);
    free(p->items);
    memset(p, 0, sizeof *p);
}

at_status at_batch_plan_make(const size_t *lengths, size_t n, const at_batch_options *o, at_batch_plan *out)
{
    at_status st = AT_OK;
    size_t *bin_of = NULL, *row_len = NULL, *order = NULL, *fill = NULL;
    len_item *it = NULL;
    memset(out, 0, sizeof *out);
    if (o->batch_size == 0) return at_error(AT_ERR_INVALID, "batch size must be positive");
    if (n == 0) return at_error(AT_ERR_INVALID, "no samples to batch");
    size_t nr = n;
    out->items = malloc(n * sizeof *out->items);
    out->row_start = malloc((n + 1) * sizeof *out->row_start);
    row_len = malloc(n * sizeof *row_len);
    order = malloc(n * sizeof *order);
    if (!out->items || !out->row_start || !row_len || !order) goto nomem;
    out->packing_length = o->packing_length;
    at_rng rng;
    at_rng_seed(&rng, o->seed);
    if (o->packing_length) {
        bin_of = malloc(n * sizeof *bin_of);
        fill = calloc(n + 1, sizeof *fill);
        if (!bin_of || !fill) goto nomem;
        AT_CHECK(at_pack_ffd(lengths, n, o->packing_length, bin_of, &nr));
        /* counting sort of the samples by row, in sample order within a row */
        for (size_t i = 0; i < n; i++) fill[bin_of[i] + 1]++;
        for (size_t r = 0; r < nr; r++) fill[r + 1] += fill[r];
        memcpy(out->row_start, fill, (nr + 1) * sizeof *fill);
        for (size_t i = 0; i < n; i++) out->items[fill[bin_of[i]]++] = i;
        for (size_t r = 0; r < nr; r++) {
            row_len[r] = 0;
            for (size_t k = out->row_start[r]; k < out->row_start[r + 1]; k++) row_len[r] += lengths[out->items[k]];
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            out->items[i] = i;
            out->row_start[i] = i;
            row_len[i] = lengths[i];
        }
        out->row_start[n] = n;
    }
    out->n_rows = nr;
    /* the order of the rows */
    for (size_t r = 0; r < nr; r++) order[r] = r;
    if (o->shuffle || o->group_by_length) shuffle_idx(&rng, order, nr);
    if (o->group_by_length) {
        it = malloc(nr * sizeof *it);
        if (!it) goto nomem;
        for (size_t k = 0; k < nr; k++) it[k] = (len_item){row_len[order[k]], order[k], k};
        qsort(it, nr, sizeof *it, by_len_desc);
        for (size_t k = 0; k < nr; k++) order[k] = it[k].idx;
    }
    size_t nbatch = (nr + o->batch_size - 1) / o->batch_size;
    if (o->drop_last && nr % o->batch_size) nbatch--;
    if (nbatch == 0) {
        st = at_error(AT_ERR_INVALID, "%zu rows make no full batch of %zu", nr, o->batch_size);
        goto done;
    }
    /* batch order: shuffle the groups so similar lengths stay together but
     * the epoch does not run from longest to shortest */
    size_t *border = malloc(nbatch * sizeof *border);
    if (!border) goto nomem;
    for (size_t b = 0; b < nbatch; b++) border[b] = b;
    if (o->group_by_length && o->shuffle) shuffle_idx(&rng, border, nbatch);
    /* rewrite rows in final order: batch_start over the new row list */
    size_t *new_rs = malloc((nr + 1) * sizeof *new_rs), *new_items = malloc(n * sizeof *new_items);
    out->batch_start = malloc((nbatch + 1) * sizeof *out->batch_start);
    if (!new_rs || !new_items || !out->batch_start) {
        free(border);
        free(new_rs);
        free(new_items);
        goto nomem;
    }
    size_t rr = 0, ii = 0;
    for (size_t b = 0; b < nbatch; b++) {
        out->batch_start[b] = rr;
        size_t first = border[b] * o->batch_size, last = first + o->batch_size;
        if (last > nr) last = nr;
        for (size_t k = first; k < last; k++) {
            size_t r = order[k];
            new_rs[rr++] = ii;
            for (size_t j = out->row_start[r]; j < out->row_start[r + 1]; j++) new_items[ii++] = out->items[j];
        }
    }
    out->batch_start[nbatch] = rr;
    new_rs[rr] = ii;
    free(border);
    free(out->row_start);
    free(out->items);
    out->row_start = new_rs;
    out->items = new_items;
    out->n_rows = rr;
    out->n_batches = nbatch;
    goto done;
nomem:
    st = at_error(AT_ERR_NOMEM, "out of memory planning batches");
done:
    free(bin_of);
    free(row_len);
    free(order);
    free(fill);
    free(it);
    if (st != AT_OK) at_batch_plan_free(out);
    return st;
}

void at_batch_free(at_batch *b)
{
    if (!b) return;
    free(b->ids);
    free(b->labels);
    free(b->positions);
    free(b->segments);
    free(b->lengths);
    free(b->pixels);
    free(b->grid_thw);
    free(b->row_images);
    free(b->mpos);
    memset(b, 0, sizeof *b);
}

at_status at_batch_build(const at_batch_plan *p, size_t b, const at_encoded *samples, size_t n_samples,
                         int32_t pad_id, at_batch *out)
{
    memset(out, 0, sizeof *out);
    if (b >= p->n_batches) return at_error(AT_ERR_INVALID, "batch %zu of %zu", b, p->n_batches);
    size_t r0 = p->batch_start[b], r1 = p->batch_start[b + 1], rows = r1 - r0, cols = p->packing_length;
    for (size_t r = r0; r < r1; r++) {
        size_t len = 0;
        for (size_t k = p->row_start[r]; k < p->row_start[r + 1]; k++) {
            if (p->items[k] >= n_samples) return at_error(AT_ERR_INVALID, "plan names sample %zu of %zu", p->items[k], n_samples);
            len += samples[p->items[k]].n;
        }
        if (p->packing_length && len > p->packing_length)
            return at_error(AT_ERR_INVALID, "row of %zu tokens exceeds the packing length %zu", len, p->packing_length);
        if (!p->packing_length && len > cols) cols = len;
    }
    if (cols == 0) cols = 1;
    size_t cells = rows * cols;
    out->ids = malloc(cells * sizeof *out->ids);
    out->labels = malloc(cells * sizeof *out->labels);
    out->positions = calloc(cells, sizeof *out->positions);
    out->segments = calloc(cells, sizeof *out->segments);
    out->lengths = malloc(rows * sizeof *out->lengths);
    if (!out->ids || !out->labels || !out->positions || !out->segments || !out->lengths) {
        at_batch_free(out);
        return at_error(AT_ERR_NOMEM, "out of memory building a batch of %zu x %zu", rows, cols);
    }
    out->rows = rows;
    out->cols = cols;
    for (size_t r = 0; r < rows; r++) {
        int32_t *ids = out->ids + r * cols, *lab = out->labels + r * cols;
        int32_t *pos = out->positions + r * cols, *seg = out->segments + r * cols;
        size_t c = 0;
        int32_t sid = 0;
        for (size_t k = p->row_start[r0 + r]; k < p->row_start[r0 + r + 1]; k++) {
            const at_encoded *e = &samples[p->items[k]];
            sid++;
            for (size_t t = 0; t < e->n; t++, c++) {
                ids[c] = e->ids[t];
                lab[c] = e->labels[t];
                pos[c] = (int32_t)t;
                seg[c] = sid;
            }
        }
        out->lengths[r] = (int32_t)c;
        for (; c < cols; c++) {
            ids[c] = pad_id;
            lab[c] = AT_IGNORE_INDEX;
        }
    }
    return AT_OK;
}

at_batch at_batch_rows(const at_batch *b, size_t r0, size_t r1)
{
    at_batch v = *b;
    size_t off = r0 * b->cols;
    v.ids = b->ids + off;
    v.labels = b->labels + off;
    v.positions = b->positions + off;
    v.segments = b->segments ? b->segments + off : NULL;
    v.lengths = b->lengths + r0;
    v.rows = r1 - r0;
    v.mpos = b->mpos ? b->mpos + off * 3 : NULL;
    if (b->row_images) {
        size_t i0 = b->row_images[r0] - b->row_images[0], i1 = b->row_images[r1] - b->row_images[0], p0 = 0, np = 0;
        for (size_t i = 0; i < i1; i++) {
            size_t n = (size_t)b->grid_thw[i][0] * (size_t)b->grid_thw[i][1] * (size_t)b->grid_thw[i][2];
            if (i < i0) p0 += n;
            else np += n;
        }
        v.row_images = b->row_images + r0;
        v.grid_thw = b->grid_thw + i0;
        v.n_images = i1 - i0;
        v.pixels = b->pixels + p0 * b->patch_dim;
        v.n_patches = np;
    }
    return v;
}

/* Appends the patches of one image to out's pixels and grids. */
static at_status append_image(at_batch *out, const at_image_patches *pp, size_t *cap_patches, size_t *cap_images)
{
    if (out->patch_dim && pp->patch_dim != out->patch_dim)
        return at_error(AT_ERR_INVALID, "patches of %zu values, the batch's have %zu", pp->patch_dim, out->patch_dim);
    out->patch_dim = pp->patch_dim;
    if (out->n_patches + pp->n_patches > *cap_patches) {
        size_t cap = (*cap_patches ? *cap_patches * 2 : 256) + pp->n_patches;
        float *p = realloc(out->pixels, cap * pp->patch_dim * sizeof *p);
        if (!p) return at_error(AT_ERR_NOMEM, "out of memory holding a batch's images (%zu patches)", cap);
        out->pixels = p;
        *cap_patches = cap;
    }
    if (out->n_images + 1 > *cap_images) {
        size_t cap = *cap_images ? *cap_images * 2 : 8;
        int32_t (*g)[3] = realloc(out->grid_thw, cap * sizeof *g);
        if (!g) return at_error(AT_ERR_NOMEM, "out of memory");
        out->grid_thw = g;
        *cap_images = cap;
    }
    memcpy(out->pixels + out->n_patches * pp->patch_dim, pp->values, pp->n_patches * pp->patch_dim * sizeof(float));
    out->n_patches += pp->n_patches;
    out->grid_thw[out->n_images][0] = pp->grid_t;
    out->grid_thw[out->n_images][1] = pp->grid_h;
    out->grid_thw[out->n_images][2] = pp->grid_w;
    out->n_images++;
    return AT_OK;
}

at_status at_batch_add_images(at_batch *out, const at_batch_plan *p, size_t b, const at_sample_images *imgs,
                              size_t n_samples, const at_image_processor *proc)
{
    size_t r0 = p->batch_start[b], cap_patches = 0, cap_images = 0;
    out->row_images = calloc(out->rows + 1, sizeof *out->row_images);
    if (!out->row_images) return at_error(AT_ERR_NOMEM, "out of memory");
    for (size_t r = 0; r < out->rows; r++) {
        for (size_t k = p->row_start[r0 + r]; k < p->row_start[r0 + r + 1]; k++) {
            if (p->items[k] >= n_samples) return at_error(AT_ERR_INVALID, "plan names sample %zu of %zu", p->items[k], n_samples);
            const at_sample_images *si = &imgs[p->items[k]];
            for (size_t i = 0; i < si->n; i++) {
                at_image img;
                at_image_patches pp = {0};
                char name[64];
                snprintf(name, sizeof name, "image %zu", i + 1);
                at_status st = at_media_load_image(si->refs[i], 0, &img);
                if (st == AT_OK) {
                    st = at_image_to_patches(proc, &img, si->refs[i], &pp);
                    at_image_free(&img);
                }
                if (st == AT_OK) st = append_image(out, &pp, &cap_patches, &cap_images);
                at_image_patches_free(&pp);
                if (st != AT_OK)
                    return at_error_wrap(st, "%s:%d: %s of the sample (%.200s)", si->source, si->line, name,
                                         strncmp(si->refs[i], "data:", 5) && strlen(si->refs[i]) <= 200
                                             ? si->refs[i] : "inline base64");
            }
        }
        out->row_images[r + 1] = out->n_images;
    }
    return AT_OK;
}
