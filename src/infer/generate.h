/* Generating text for one sequence.
 *
 * at_gen_seq is the per-sequence state every generator shares (the one-shot
 * runner below and the batch scheduler of scheduler.h): the sampler, the
 * streaming detokenizer (never cuts a UTF-8 character), stop tokens and stop
 * strings, the token budget, and the text produced so far. Text that could be
 * the beginning of a stop string is held back until it is known not to be,
 * so a stop string never reaches the output, even split across tokens.
 *
 * at_generator runs one sequence on a decoder with its own KV cache, and
 * keeps the cache between calls: a prompt that extends the previous one (a
 * chat turn) only prefills the new tokens. */
#ifndef AT_INFER_GENERATE_H
#define AT_INFER_GENERATE_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "infer/sampling.h"
#include "model/adapter.h"
#include "model/decoder.h"
#include "model/vision.h"
#include "text/tokenizer.h"

typedef enum {
    AT_FINISH_NONE = 0, /* still running */
    AT_FINISH_STOP,     /* a stop token or stop string */
    AT_FINISH_LENGTH,   /* max_new_tokens, or the context is full */
    AT_FINISH_CANCELLED,
    AT_FINISH_ERROR
} at_finish_reason;

/* "stop", "length", "cancelled", "error" (OpenAI's finish_reason), or NULL
 * while running. */
const char *at_finish_reason_name(at_finish_reason r);

#define AT_GEN_MAX_STOP 16

typedef struct at_gen_params {
    at_sampling_params sampling;
    int max_new_tokens;          /* <= 0: until a stop or the context is full */
    const char *const *stop;     /* stop strings (copied), n_stop <= AT_GEN_MAX_STOP */
    int n_stop;
    const int32_t *stop_ids;     /* stop tokens (copied); not part of the text */
    int n_stop_ids;
    at_adapter *adapter;         /* LoRA adapter applied unmerged (borrowed), NULL: the base model */
    int continues_prompt;        /* the answer continues the prompt's text (completions, no chat template): its
                                    first token keeps its leading space unless the prompt is only special tokens
                                    (BOS); 0: a text of its own (a chat answer) */
} at_gen_params;

/* Defaults: greedy, no budget, no stops. */
at_gen_params at_gen_params_default(void);

typedef struct at_gen_seq at_gen_seq;

/* A sequence generating with tokenizer tok (borrowed, must outlive it) over a
 * vocabulary of `vocab` logits. Caller frees with at_gen_seq_free. */
at_status at_gen_seq_new(const at_tokenizer *tok, int vocab, const at_gen_params *p, at_gen_seq **out);
void at_gen_seq_free(at_gen_seq *g); /* NULL ok */

/* Starts over with a prompt (the repetition penalty sees it). */
at_status at_gen_seq_start(at_gen_seq *g, const int32_t *prompt, size_t n);

/* Draws the next token from the logits of the last position, records it and
 * its text. *token gets the token; returns the finish reason (NONE while the
 * sequence goes on). A stop token finishes without text; a stop string cuts
 * the text before it. room: how many more tokens the context can take after
 * this one; 0 finishes with LENGTH. */
at_status at_gen_seq_next(at_gen_seq *g, const float *logits, int room, int32_t *token, at_finish_reason *fin);

/* Ends the sequence (cancel, error, or a full context before any token):
 * releases held-back text. */
void at_gen_seq_finish(at_gen_seq *g, at_finish_reason why);

/* The text produced since the last call (may be empty), owned by g and valid
 * until the next call on g. */
void at_gen_seq_take_text(at_gen_seq *g, const char **text, size_t *len);

at_finish_reason at_gen_seq_finished(const at_gen_seq *g);
int at_gen_seq_tokens(const at_gen_seq *g);       /* tokens generated (stop token included) */
/* The generated ids (the stop token included), owned by g. */
const int32_t *at_gen_seq_ids(const at_gen_seq *g);

/* ---- a prompt's images ---------------------------------------------------- */

/* What a prompt of a vision-language model carries besides its ids (built by
 * infer/vlm.h; everything borrowed). The prefix caches (the generator's
 * below, the scheduler's) compare keys, not ids: an image token's key is a
 * hash of its image's pixel values, grid and its index in the image, so a
 * cached prefix holding an image is reused only for the same image. The
 * features are computed when a prefill first needs them (never for a prompt
 * whose images all come from the cache). */
typedef struct at_prompt_media {
    at_vision *vision;              /* the tower (on the decoder's backend) */
    int n_images;
    const float *pixels;            /* host [n_patches, patch dim]: at_vision_forward's input */
    int64_t n_patches;
    const int32_t (*grid_thw)[3];   /* [n_images] */
    int32_t image_token;            /* <|image_pad|> */
    const uint64_t *keys;           /* [n]: the prompt's keys (at_prompt_key) */
    const int32_t *mrope_pos;       /* [n, 3]: (t, h, w) positions (mrope.h) */
} at_prompt_media;

/* The key of a text token: its id. An image token's have the top bit set. */
static inline uint64_t at_prompt_text_key(int32_t id) { return (uint32_t)id; }

/* The features of every image of m: host f32 [rows, cols] (*out, caller
 * frees), rows = the image tokens, cols = the language model's width; for
 * Qwen3-VL the buffer goes on with its deepstack features, rows more for
 * each deepstack layer (at_vision_feature_rows). */
at_status at_prompt_media_features(const at_prompt_media *m, float **out, int64_t *rows, int64_t *cols);

/* ---- one sequence on a decoder ------------------------------------------ */

typedef struct at_generator at_generator;

typedef struct at_gen_stats {
    int prompt_tokens;    /* tokens of the prompt */
    int prefilled_tokens; /* of those, how many ran (the rest came from the cache) */
    int new_tokens;       /* tokens generated */
    double prefill_s;     /* seconds of the prefill (to the first token's logits) */
    double decode_s;      /* seconds of the decode steps after it */
    int images_encoded;   /* images run through the vision tower (0 when the cache held them) */
} at_gen_stats;

/* Called with each piece of text as it is produced; return nonzero to stop
 * (finish reason CANCELLED). */
typedef int (*at_gen_text_fn)(void *user, const char *text, size_t len);

/* A generator on decoder d (borrowed) for sequences of up to max_seq tokens
 * (prompt and output). Caller frees with at_generator_free. */
at_status at_generator_new(at_decoder *d, const at_tokenizer *tok, int max_seq, at_generator **out);
void at_generator_free(at_generator *g); /* NULL ok */

/* Generates after prompt[0..n) (n >= 1). Text goes to on_text (may be NULL)
 * as it comes; *fin (may be NULL) gets the finish reason; stats (may be NULL)
 * the counts and times. When out_text is not NULL it gets the whole text (a
 * new string the caller frees). A prompt longer than max_seq - 1 is refused. */
at_status at_generator_run(at_generator *g, const int32_t *prompt, size_t n, const at_gen_params *p,
                           at_gen_text_fn on_text, void *user, char **out_text, at_finish_reason *fin,
                           at_gen_stats *stats);

/* at_generator_run for a prompt with images (media NULL: at_generator_run).
 * An M-RoPE model's prompt without media gets text positions. */
at_status at_generator_run_media(at_generator *g, const int32_t *prompt, size_t n, const at_prompt_media *media,
                                 const at_gen_params *p, at_gen_text_fn on_text, void *user, char **out_text,
                                 at_finish_reason *fin, at_gen_stats *stats);

/* Forgets the cached prompt (the next run prefills everything). */
void at_generator_reset(at_generator *g);

#endif
