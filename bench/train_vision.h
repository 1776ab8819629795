/* bench/train's vision row (bench/train_vision.c). */
#ifndef AT_BENCH_TRAIN_VISION_H
#define AT_BENCH_TRAIN_VISION_H

/* Runs the row: our LoRA step of a Qwen2-VL-shaped model with images (f32
 * and bf16 frozen weights) against tools/bench_vlm_torch.py (f32 best and
 * bf16 autocast) with `threads` threads, median of `steps` steps; torch 0
 * skips the peer. Prints everything; returns 0, or 1 when our step failed. */
int bench_train_vision(int steps, int torch, int threads);

#endif
