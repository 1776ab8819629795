/* TensorBoard event files (`--report_to tensorboard`): what the Hugging Face
 * Trainer's TensorBoardCallback writes, so `tensorboard --logdir RUN/runs`
 * shows a run's curves.
 *
 * A file RUN/runs/events.out.tfevents.TIME.HOST.PID.0 is a sequence of
 * TFRecords, each
 *   uint64 length (little-endian), uint32 masked_crc32c(length bytes),
 *   data[length], uint32 masked_crc32c(data)
 * with masked_crc32c(x) = rotr15(crc32c(x)) + 0xa282ead8, and each data a
 * serialized tensorboard.Event (tensorboard/compat/proto/event.proto): the
 * first holds file_version "brain.Event:2", the others a step, a wall time
 * and a Summary of scalar Values (tag, simple_value). */
#ifndef AT_TRAIN_TENSORBOARD_H
#define AT_TRAIN_TENSORBOARD_H

#include <stdint.h>
#include <stdio.h>
#include <cjson/cJSON.h>
#include "base/status.h"

typedef struct {
    FILE *f;
    char *path; /* owned */
} at_tb_writer;

/* Creates dir (and parents) and a new event file in it, with its
 * file_version event. Close with at_tb_close. */
at_status at_tb_open(at_tb_writer *w, const char *dir);
/* One event at step (and the wall time now) holding a scalar for every number of line except
 * "step", tagged as transformers' TensorBoardCallback tags them ("eval_X"
 * becomes "eval/X", any other key K "train/K"); flushed. Nothing when line
 * has no other number. */
at_status at_tb_write_scalars(at_tb_writer *w, int64_t step, const cJSON *line);
void at_tb_close(at_tb_writer *w); /* safe on a zeroed writer, and twice */

/* CRC-32C (Castagnoli) of data[0..n), as the TFRecord framing uses it. */
uint32_t at_crc32c(const void *data, size_t n);

#endif
