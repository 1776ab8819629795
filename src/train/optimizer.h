/* AdamW over a list of trainable tensors, with the global gradient norm,
 * clipping, and its state in a checkpoint (trainer_state.safetensors). */
#ifndef AT_TRAIN_OPTIMIZER_H
#define AT_TRAIN_OPTIMIZER_H

#include <stdint.h>
#include "base/status.h"
#include "device/tensor.h"
#include "model/decoder.h"

typedef struct {
    double beta1, beta2, eps, weight_decay, max_grad_norm; /* max_grad_norm 0: no clipping */
} at_adamw_config;

typedef struct {
    at_adamw_config cfg;
    int n;
    at_param_grad *params; /* not owned tensors (the decoder's and the gradients') */
    at_tensor **m, **v;    /* f32 moments, owned */
    at_tensor *sumsq;      /* f32 [n] scratch: each gradient's Σ g², read back at once */
    float *sumsq_host;     /* their host copy [n], owned */
    int64_t step;          /* updates done */
    /* parameter groups (at_optimizer_set_group): each tensor's learning rate over the scheduled one, and
     * the updates it sits out first */
    double *lr_scale;      /* [n], 1 by default */
    int64_t *held;         /* [n], 0 by default */
} at_optimizer;

/* Zeroed moments for every trainable of d under g. Free with at_optimizer_free. */
at_status at_optimizer_init(at_optimizer *o, at_decoder *d, const at_decoder_grads *g, const at_adamw_config *cfg);
/* The same plus n_extra more (param, gradient) pairs after the decoder's (an
 * objective's own tensors, train/objective.h). */
at_status at_optimizer_init_ex(at_optimizer *o, at_decoder *d, const at_decoder_grads *g, const at_param_grad *extra,
                               int n_extra, const at_adamw_config *cfg);
/* Zeroed moments for the n (param, gradient) pairs of params (copied; the
 * tensors stay the caller's), in that order; be holds the norm's scratch. */
at_status at_optimizer_init_list(at_optimizer *o, at_backend *be, const at_param_grad *params, int n,
                                 const at_adamw_config *cfg);
void at_optimizer_free(at_optimizer *o);

/* Tensor i's group: learning rate lr · lr_scale at every step (ms-swift's
 * --vit_lr / --aligner_lr: the schedule scales every group alike), and no
 * update at all (no moments, no weight decay) during the first `held`
 * updates; its bias correction then counts its own updates, as torch's
 * AdamW does for a tensor whose first gradient came at update held + 1. */
void at_optimizer_set_group(at_optimizer *o, int i, double lr_scale, int64_t held);

/* sqrt(Σ over every gradient of Σ g²) (computed in double across tensors). */
at_status at_optimizer_grad_norm(at_optimizer *o, double *norm);

/* One update at learning rate lr: gradients multiplied by unscale (1 / loss
 * scale; 1 without loss scaling) and by clip, where clip = min(1,
 * max_grad_norm / (grad_norm + 1e-6)) as torch's clip_grad_norm_ (grad_norm
 * of the unscaled gradients). */
at_status at_optimizer_step(at_optimizer *o, double lr, double grad_norm, double unscale);

/* Moments and step into / from a safetensors file ("exp_avg.<param name>",
 * "exp_avg_sq.<param name>", metadata "optimizer_step"); meta_kv holds n_meta
 * more key, value string pairs written into the metadata (read them back with
 * the safetensors reader). */
at_status at_optimizer_save(const at_optimizer *o, const char *path, const char *const *meta_kv, int n_meta);
at_status at_optimizer_load(at_optimizer *o, const char *path);

#endif
