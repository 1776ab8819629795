/* Shared between chat_template.c and chat_template_mask.c; not a public API. */
#ifndef AT_TEXT_CHAT_TEMPLATE_INTERNAL_H
#define AT_TEXT_CHAT_TEMPLATE_INTERNAL_H

#include "text/chat_template.h"

/* Renders the first n messages with add_generation_prompt = agp (other
 * variables from opt). *text: caller frees. */
at_status at_chat_render_prefix(const at_chat_template *ct, const cJSON *messages, int n,
                                const at_chat_render_opts *opt, int agp, char **text, size_t *len);

/* The assistant spans of `full` (the text of all messages as rendered with
 * opt), chosen by opt->mask. *spans: caller frees (NULL when none). */
at_status at_chat_find_spans(const at_chat_template *ct, const cJSON *messages, const at_chat_render_opts *opt,
                             const char *full, size_t full_len, at_chat_span **spans, size_t *n_spans);

#endif
