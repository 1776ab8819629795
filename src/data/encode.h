/* Samples -> token ids and labels.
 *
 * The encoder does not know chat templates or tokenizers; it takes them as
 * callbacks, so text/ can plug in later:
 *   render:   conversation -> text, plus the byte spans the model learns
 *             (the assistant's replies with their end-of-turn markers)
 *   tokenize: text -> ids, plus the bytes each token covers
 * Labels follow Hugging Face (unshifted; the loss shifts): labels[i] = ids[i]
 * for a token inside a trained span, else -100. A token covering bytes
 * [b, e) with b < e is inside a span [sb, se) when sb <= b and e <= se. A
 * token with no bytes (b == e, e.g. BOS or EOS added by the tokenizer) sits
 * at position b and is inside when sb < b <= se: an EOS right after a
 * reply is trained, a BOS before everything is not.
 *
 * Then --max_length with --truncation_strategy (ms-swift's names): delete
 * drops a longer sample, left keeps its last max_length tokens, right its
 * first max_length. */
#ifndef AT_DATA_ENCODE_H
#define AT_DATA_ENCODE_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "data/dataset.h"

#define AT_IGNORE_INDEX (-100)

typedef struct {
    size_t begin, end; /* bytes [begin, end) */
} at_byte_span;

/* Renders s (a conversation) into *text (*len bytes) and the trained spans.
 * Both arrays are malloc'd by the callee and freed by the caller. */
typedef at_status (*at_render_fn)(void *ctx, const at_sample *s, char **text, size_t *len, at_byte_span **spans,
                                  size_t *n_spans);
/* Tokenizes text[0..len): *ids and *offsets (n entries each, offsets
 * non-decreasing) are malloc'd by the callee and freed by the caller. */
typedef at_status (*at_tokenize_fn)(void *ctx, const char *text, size_t len, int32_t **ids, at_byte_span **offsets,
                                    size_t *n);

typedef enum { AT_TRUNCATE_DELETE = 0, AT_TRUNCATE_LEFT, AT_TRUNCATE_RIGHT } at_truncation;

/* "delete", "left", "right". */
at_status at_truncation_parse(const char *name, at_truncation *out);

typedef struct {
    at_render_fn render;
    void *render_ctx;
    at_tokenize_fn tokenize;
    void *tokenize_ctx;
    size_t max_length; /* 0: no limit */
    at_truncation truncation;
} at_encoder;

/* One encoded sample; the arrays are malloc'd (at_encoded_free). */
typedef struct {
    int32_t *ids, *labels;
    size_t n;
} at_encoded;

void at_encoded_free(at_encoded *e);

/* Frames a text sample (pt) in place as one document: bos before it, eos
 * after it (either < 0: none), so packed documents stay apart. The EOS is
 * predicted (label = eos), the BOS is not. */
at_status at_encoded_frame(at_encoded *e, int32_t bos, int32_t eos);

/* labels[i] from ids and token byte offsets against the trained spans (any
 * order, may overlap), by the rule above. AT_ERR_INVALID when an offset is
 * reversed. */
at_status at_encode_labels(const int32_t *ids, const at_byte_span *offsets, size_t n, const at_byte_span *spans,
                           size_t n_spans, int32_t *labels);

/* Applies max_length / truncation to e in place. *dropped = 1 when the
 * strategy is delete and e is too long (e is then freed and empty). */
at_status at_encode_truncate(at_encoded *e, size_t max_length, at_truncation t, int *dropped);

/* Encodes one sample: conversations through render + tokenize; texts are
 * tokenized whole and trained on everywhere (pt); token samples are copied
 * (labels default to the ids). Preference pairs: use at_encode_preference.
 * *dropped as in at_encode_truncate (out is then empty). */
at_status at_encode_sample(const at_encoder *enc, const at_sample *s, at_encoded *out, int *dropped);

/* prompt + chosen and prompt + rejected, each as one conversation. When
 * either is dropped, both are (and *dropped = 1). */
at_status at_encode_preference(const at_encoder *enc, const at_sample *s, at_encoded *chosen, at_encoded *rejected,
                               int *dropped);

#endif
