/* Continuous batching: several sequences decoded together, one token each
 * per step, in one KV cache of max_batch slots.
 *
 * A sequence added between steps is prefilled at the next step (in pieces of
 * min(512, 2048 / max_batch) tokens per step, so a long prompt does not stall
 * the others nor need a huge scratch) and
 * decodes with the rest from then on; a sequence that finishes leaves its
 * slot, which the next sequence can take. Each step runs at most two decoder
 * calls: one decode step for every running sequence and one prefill for the
 * sequences still reading their prompts (one of each per adapter in use).
 *
 * Prefix cache: a finished sequence leaves its keys and values in its slot.
 * A new sequence takes the free slot whose cached tokens share the longest
 * prefix with its prompt (same adapter), and prefills only the rest (at
 * least its last token, for the logits). Tokens are compared by their keys
 * (at_prompt_media): an image's tokens match only the same image, and its
 * features (the vision tower's forward) are computed at the first prefill
 * that needs them, never when the cache holds the whole image.
 *
 * Not thread-safe: one thread (the server's engine) owns a scheduler. */
#ifndef AT_INFER_SCHEDULER_H
#define AT_INFER_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "infer/generate.h"
#include "model/adapter.h"
#include "model/decoder.h"
#include "text/tokenizer.h"

typedef struct at_scheduler at_scheduler;

/* What happened to one sequence in a step. */
typedef struct at_sched_event {
    int slot;
    void *user;               /* as given to at_scheduler_add */
    const char *text;         /* new text, valid until the next step */
    size_t len;
    int32_t token;            /* the token drawn this step, -1 when none */
    at_finish_reason finish;  /* NONE while running; the slot is free after this step */
    int prompt_tokens;
    int completion_tokens;    /* so far */
    int cached_tokens;        /* prompt tokens taken from the prefix cache */
    int images_encoded;       /* images run through the vision tower for this sequence */
} at_sched_event;

/* A scheduler on decoder d (borrowed) with max_batch slots of up to max_seq
 * tokens each (prompt and output). Caller frees with at_scheduler_free. */
at_status at_scheduler_new(at_decoder *d, const at_tokenizer *tok, int max_batch, int max_seq, at_scheduler **out);
void at_scheduler_free(at_scheduler *s); /* NULL ok */

int at_scheduler_capacity(const at_scheduler *s);  /* max_batch */
int at_scheduler_in_use(const at_scheduler *s);    /* slots with a running sequence */
int at_scheduler_max_seq(const at_scheduler *s);

/* Adds a sequence to a free slot (*slot gets it). The prompt (1 to max_seq - 1
 * tokens) is copied; p->adapter (borrowed) is applied to this sequence only.
 * AT_ERR_INVALID when no slot is free or the prompt does not fit. */
at_status at_scheduler_add(at_scheduler *s, const int32_t *prompt, size_t n, const at_gen_params *p, void *user,
                           int *slot);

/* at_scheduler_add for a prompt with images (media NULL: at_scheduler_add).
 * media is copied (its vision tower is borrowed). An M-RoPE model's prompt
 * without media gets text positions. */
at_status at_scheduler_add_media(at_scheduler *s, const int32_t *prompt, size_t n, const at_prompt_media *media,
                                 const at_gen_params *p, void *user, int *slot);

/* Ends the sequence in `slot` at the next step (finish CANCELLED). */
void at_scheduler_cancel(at_scheduler *s, int slot);

/* Runs one step. *events (owned by s, valid until the next step or
 * at_scheduler_add, which may reuse a finished slot) gets one
 * entry per sequence that produced something or finished. A decoder failure
 * finishes the sequences of that call with AT_FINISH_ERROR, and the status
 * is returned (the others go on). */
at_status at_scheduler_step(at_scheduler *s, const at_sched_event **events, int *n_events);

#endif
