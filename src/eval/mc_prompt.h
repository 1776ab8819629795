/* The prompts of multiple-choice evaluation, LLaMA-Factory's scheme
 * (src/llamafactory/eval/template.py):
 *
 *   one example  = question + "\nA. " + A + "\nB. " + B + "\nC. " + C + "\nD. " + D + "\nAnswer:"
 *                  (zh: "\n答案：" instead of "\nAnswer:")
 *   conversation = n_shot few-shot examples as user turns, each answered by an
 *                  assistant turn holding the letter ("B"), then the question as
 *                  the last user turn; the system line
 *                    en: "The following are multiple choice questions (with answers) about {subject}.\n\n"
 *                    zh: "以下是中国关于{subject}考试的单项选择题，请选出其中的正确答案。\n\n"
 *                  is put in front of the first user turn's text.
 * The conversation goes through the model's chat template with the
 * generation prompt, so the model's next token is its answer. Without a
 * template, LLaMA-Factory's "fewshot" layout is used: the turns' texts
 * joined, with "\n\n" before each user turn but the first.
 *
 * The shots are the first n_shot questions of the subject's dev file (the
 * original MMLU evaluation's choice; LLaMA-Factory draws them at random
 * without a seed, which no two runs reproduce). */
#ifndef AT_EVAL_MC_PROMPT_H
#define AT_EVAL_MC_PROMPT_H

#include <stddef.h>
#include <cjson/cJSON.h>
#include "base/status.h"
#include "eval/mc_csv.h"
#include "text/chat_template.h"

typedef enum { AT_MC_EN = 0, AT_MC_ZH } at_mc_lang;

/* "en" or "zh". */
at_status at_mc_lang_parse(const char *s, at_mc_lang *out);
const char *at_mc_lang_name(at_mc_lang l);

/* One example's text (question, choices, answer cue). Caller frees; NULL
 * when out of memory. */
char *at_mc_format_question(const at_mc_item *it, at_mc_lang lang);

/* The messages [{role, content}] for question q after the shots
 * shots[0..n_shots), as an OpenAI-style array; subject is the display name
 * of the system line. Caller owns *out (cJSON_Delete). */
at_status at_mc_messages(const at_mc_item *q, const at_mc_item *shots, size_t n_shots, const char *subject,
                         at_mc_lang lang, cJSON **out);

/* The prompt text of messages: through tmpl with the generation prompt, or
 * with tmpl NULL the fewshot layout above. *text is a new NUL-terminated
 * string (caller frees), *len its length. */
at_status at_mc_prompt_text(const at_chat_template *tmpl, const cJSON *messages, char **text, size_t *len);

#endif
