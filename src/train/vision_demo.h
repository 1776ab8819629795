/* The bundled vision demo (`anytune sft --demo vision`): a tiny random
 * Qwen2-VL (demo/qwen2-vl-tiny, written by tools/make_tiny_vlm.py --vocab
 * bytes) learns to name the colour of small generated pictures.
 *
 * The pictures: squares of 28 to 84 pixels, one of four colours (red,
 * green, blue, yellow) with noise on every pixel, written as PNG files
 * (libpng) beside train.jsonl ("<image>What colour is this?" -> the colour's
 * name) and test.jsonl (each test picture once per colour). The accuracy on
 * the test pictures: a picture counts as named right when its colour's
 * answer has the lowest loss of the four (the model ranks the answers: no
 * sampling, no decoding rules). */
#ifndef AT_TRAIN_VISION_DEMO_H
#define AT_TRAIN_VISION_DEMO_H

#include <stdint.h>
#include "base/status.h"

#define AT_VISION_DEMO_COLOURS 4

typedef struct {
    char train[1100], test[1100]; /* the two dataset files */
    int n_test;                   /* test pictures */
    int *test_colour;             /* [n_test]: each one's colour (an index of the names) */
} at_vision_demo;

/* The colours' names, in index order. */
extern const char *const at_vision_demo_colours[AT_VISION_DEMO_COLOURS];

/* Writes the pictures and datasets into folder dir (made when missing):
 * n_train training pictures and n_test test ones, from seed. Free with
 * at_vision_demo_free. */
at_status at_vision_demo_make(const char *dir, uint64_t seed, int n_train, int n_test, at_vision_demo *out);
void at_vision_demo_free(at_vision_demo *d);

/* The share of test pictures named right by the model folder `model` with,
 * when ckpt is not NULL, checkpoint ckpt's weights: its LoRA adapter, or
 * (full fine-tuning) its language model, and its tower tensors
 * (train/vision_ckpt.h). */
at_status at_vision_demo_accuracy(const at_vision_demo *d, const char *model, const char *ckpt, double *accuracy);

#endif
