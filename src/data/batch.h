/* Encoded samples -> batches of int32 arrays.
 *
 * Packing (--packing): samples are put into rows of exactly L tokens by
 * first-fit decreasing bin packing (longest first, each into the first row
 * with room). Samples in one row neither attend to each other nor share
 * positions: position ids restart at 0 and the segment id (1, 2, ... per
 * sample, 0 for padding) tells the attention kernel where each one ends.
 *
 * Length grouping (--group_by_length): rows are sorted by length (ties in
 * seeded random order) and cut into batches of similar length, and the
 * batches are then shuffled by the seed, so padding is small and the order
 * still random. Without it rows are shuffled (when asked) and cut in order.
 *
 * The plan holds only indices, so a trainer can keep it for an epoch and
 * build (or rebuild, on resume) batch b at any time. */
#ifndef AT_DATA_BATCH_H
#define AT_DATA_BATCH_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "data/encode.h"
#include "data/image_proc.h"

/* First-fit decreasing. bin_of[i] receives the row of sample i (rows are
 * numbered in the order they were opened); *n_bins the row count. Every
 * length must be 1..capacity. */
at_status at_pack_ffd(const size_t *lengths, size_t n, size_t capacity, size_t *bin_of, size_t *n_bins);

typedef struct {
    size_t batch_size;     /* rows per batch (> 0) */
    size_t packing_length; /* L: pack into rows of L tokens; 0: one sample per row */
    int group_by_length;
    int shuffle;           /* shuffle rows (or groups) by seed */
    int drop_last;         /* drop a last batch with fewer rows */
    uint64_t seed;
} at_batch_options;

typedef struct {
    size_t n_batches, n_rows;
    size_t *batch_start; /* n_batches + 1 offsets into the rows */
    size_t *row_start;   /* n_rows + 1 offsets into items */
    size_t *items;       /* sample indices, row by row */
    size_t packing_length;
} at_batch_plan;

/* The sample indices of batch b from its item u0 on, where each row holds
 * one item (no packing): preference pairs, KTO examples. Points into p. */
static inline const size_t *at_batch_plan_items(const at_batch_plan *p, size_t b, size_t u0)
{
    return p->items + p->row_start[p->batch_start[b]] + u0;
}

/* Plans batches over samples of the given lengths. Free with at_batch_plan_free. */
at_status at_batch_plan_make(const size_t *lengths, size_t n, const at_batch_options *o, at_batch_plan *out);
void at_batch_plan_free(at_batch_plan *p);

/* Row-major [rows x cols] arrays; cols is the packing length, or the longest
 * row of the batch. Padding: ids pad_id, labels -100, position 0, segment 0.
 * lengths[r] = real tokens in row r. Free with at_batch_free. */
typedef struct {
    int32_t *ids, *labels, *positions, *segments, *lengths;
    size_t rows, cols;
    /* A vision-language batch's images (at_batch_add_images; a text batch:
     * none, NULL arrays), in the order of their tokens, row by row: */
    float *pixels;            /* [n_patches, patch_dim] image_proc.h's patches, image after image */
    size_t n_patches, patch_dim;
    int32_t (*grid_thw)[3];   /* [n_images] */
    size_t n_images;
    size_t *row_images;       /* [rows + 1]: row r holds images [row_images[r], row_images[r + 1]) of the
                                 batch (offsets counted from row_images[0]) */
    int32_t *mpos;            /* NULL, or [rows, cols, 3] M-RoPE positions (train/vlm_step.h), which the
                                 model then takes instead of `positions` */
} at_batch;

at_status at_batch_build(const at_batch_plan *p, size_t b, const at_encoded *samples, size_t n_samples,
                         int32_t pad_id, at_batch *out);
void at_batch_free(at_batch *b);

/* Rows [r0, r1) of b as a view into b's arrays (its images and M-RoPE
 * positions too): not to be freed, valid while b is. */
at_batch at_batch_rows(const at_batch *b, size_t r0, size_t r1);

/* The images of one encoded sample (borrowed references, data/media.h's
 * form) and where the sample was read, for messages. */
typedef struct {
    const char *const *refs;
    size_t n;
    const char *source;
    int line;
} at_sample_images;

/* Decodes the images of batch b's samples (imgs[n_samples], indexed as the
 * samples) and turns them into patches with processor proc (image_proc.h),
 * filling out's image fields. The pixels are made when a batch is built and
 * freed with it: memory holds the images of the batches built, never the
 * dataset's. A failure names the sample's file:line and the image. */
at_status at_batch_add_images(at_batch *out, const at_batch_plan *p, size_t b, const at_sample_images *imgs,
                              size_t n_samples, const at_image_processor *proc);

#endif
