/* Choosing the next token from a row of logits.
 *
 * The logits go through processors in the order Hugging Face's generate
 * applies them, then one token is drawn:
 *   1. repetition penalty (CTRL / HF RepetitionPenaltyLogitsProcessor), over
 *      every token seen (prompt and generated):  l > 0 ? l / r : l · r
 *   2. presence and frequency penalties (OpenAI / vLLM), over generated
 *      tokens only:  l -= frequency · count + presence · (count > 0)
 *   3. temperature:  l /= T          (T <= 0: greedy, steps 3-6 are skipped)
 *   4. top-k: keep the k largest logits (ties with the k-th kept too)
 *   5. top-p: keep the most probable tokens while the probability of those
 *      above a token is below p (so the token that crosses p is kept)
 *   6. min-p: keep tokens whose probability is at least min_p · the largest
 * Removed tokens get -inf. Greedy picks the largest logit (the lowest id on a
 * tie, as torch.argmax).
 *
 * Drawing uses llama2.c's generator (xorshift64*, 24-bit floats) and its
 * inverse-CDF walk: in id order when top-p is off, in descending
 * probability when it is on. So a llama2.c checkpoint sampled with the same
 * temperature, top-p and seed gives the tokens llama2.c's run gives. */
#ifndef AT_INFER_SAMPLING_H
#define AT_INFER_SAMPLING_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

typedef struct at_sampling_params {
    float temperature;        /* <= 0: greedy */
    int top_k;                /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off; > 0 */
    float presence_penalty;   /* 0: off; OpenAI range [-2, 2] */
    float frequency_penalty;  /* 0: off */
    uint64_t seed;            /* 0 is mapped to a fixed non-zero state */
} at_sampling_params;

/* Greedy, every processor off, seed 0. */
at_sampling_params at_sampling_defaults(void);

/* Checks ranges (temperature >= 0, top_p in (0, 1], min_p in [0, 1],
 * repetition_penalty > 0, finite penalties); the message names the field. */
at_status at_sampling_validate(const at_sampling_params *p);

typedef struct at_sampler at_sampler;

/* A sampler for a vocabulary of `vocab` ids. Caller frees with at_sampler_free. */
at_status at_sampler_new(const at_sampling_params *p, int vocab, at_sampler **out);
void at_sampler_free(at_sampler *s); /* NULL ok */

/* Starts a new sequence: forgets every count, reseeds the generator and
 * records the prompt (seen by the repetition penalty). Ids out of range are
 * ignored. */
void at_sampler_reset(at_sampler *s, const int32_t *prompt, size_t n);

/* Records a generated token (penalties). */
void at_sampler_accept(at_sampler *s, int32_t id);

/* Runs processors 1-6 on logits[vocab] in place (greedy: 1-2 only). */
void at_sampler_process(at_sampler *s, float *logits);

/* Processes a copy of logits[vocab] and draws a token (not accepted: call
 * at_sampler_accept with it). */
int32_t at_sampler_sample(at_sampler *s, const float *logits);

/* llama2.c's generator, exposed for tests: the next uniform float in [0, 1)
 * from *state (updated). */
float at_sampler_rng_f32(uint64_t *state);

#endif
