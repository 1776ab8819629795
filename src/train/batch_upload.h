/* A batch's token arrays (data/batch.h) uploaded to a device, as the
 * objectives' forwards take them. */
#ifndef AT_TRAIN_BATCH_UPLOAD_H
#define AT_TRAIN_BATCH_UPLOAD_H

#include "base/status.h"
#include "data/batch.h"
#include "device/tensor.h"

typedef struct {
    at_tensor *ids, *pos, *seg, *labels; /* i32 [rows, cols] (pos [rows, cols, 3] when the batch has M-RoPE
                                            positions); seg NULL without packing */
} at_batch_tensors;

/* Uploads b's arrays to be (segments only when with_segments). Free with at_batch_tensors_free. */
at_status at_batch_tensors_upload(struct at_backend *be, const at_batch *b, int with_segments, at_batch_tensors *out);
void at_batch_tensors_free(at_batch_tensors *t); /* safe on a zeroed struct */

#endif
