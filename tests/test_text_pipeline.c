/* Samples to ids and labels through a real chat template and tokenizer:
 * labels exactly on the assistant's answer and its end-of-turn token. */
#include <stdlib.h>
#include <string.h>
#include "data/dataset.h"
#include "data/encode.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/text_pipeline.h"
#include "testing.h"

/* Decodes the labelled tokens (labels != -100) of e into a new string. */
static char *labelled_text(const at_tokenizer *tok, const at_encoded *e)
{
    int32_t *sel = malloc(e->n * sizeof *sel);
    size_t k = 0;
    for (size_t i = 0; i < e->n; i++)
        if (e->labels[i] != AT_IGNORE_INDEX) sel[k++] = e->ids[i];
    char *s = NULL;
    at_tokenizer_decode(tok, sel, k, 0, &s, NULL);
    free(sel);
    return s;
}

static void test_demo_model(void)
{
    at_tokenizer *tok = NULL;
    at_chat_template *ct = NULL;
    CHECK_OK(at_tokenizer_load("demo/stories260K", NULL, &tok));
    CHECK_OK(at_chat_template_load("demo/stories260K", NULL, NULL, &ct));
    if (!tok || !ct) return;
    at_text_pipeline p;
    CHECK_OK(at_text_pipeline_init(&p, tok, ct, 0));
    at_encoder enc;
    at_text_pipeline_encoder(&p, &enc);
    const char *spec = "tests/data/datasets/identity.json";
    at_dataset_options o = {.seed = 42, .model_name = "anytune", .model_author = "the anytune team"};
    at_dataset *ds = NULL;
    CHECK_OK(at_dataset_load(&spec, 1, &o, &ds));
    if (!ds) return;
    const at_sample *s = ds->train.items[0];
    at_encoded e = {0};
    int dropped = 0;
    CHECK_OK(at_encode_sample(&enc, s, &e, &dropped));
    CHECK(!dropped && e.n > 10);
    /* <s> then the question; the answer and </s> are the only labelled tokens */
    CHECK(e.ids[0] == at_tokenizer_bos(tok));
    CHECK(e.labels[0] == AT_IGNORE_INDEX);
    CHECK(e.ids[e.n - 1] != at_tokenizer_eos(tok)); /* the template's trailing newline follows </s> */
    int eos_labelled = 0;
    for (size_t i = 0; i < e.n; i++)
        if (e.ids[i] == at_tokenizer_eos(tok)) eos_labelled = e.labels[i] == at_tokenizer_eos(tok);
    CHECK(eos_labelled);
    char *lab = labelled_text(tok, &e);
    const char *answer = s->messages.items[s->messages.n - 1].content;
    CHECK_MSG(lab && strstr(lab, answer) != NULL, "labelled [%s] vs answer [%s]", lab ? lab : "", answer);
    CHECK_MSG(lab && strstr(lab, "Question") == NULL, "%s", lab ? lab : "");
    CHECK(strstr(answer, "anytune") != NULL); /* {{name}} replaced */
    free(lab);
    /* the prompt for generation ends right where the answer would begin */
    cJSON *msgs = NULL;
    at_messages m1 = s->messages;
    m1.n = 1;
    CHECK_OK(at_messages_to_json(&m1, &msgs));
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(at_text_pipeline_prompt(&p, msgs, &ids, &n));
    CHECK(n > 2 && n < e.n);
    int prefix = 1;
    for (size_t i = 0; i < n && i < e.n; i++) prefix &= ids[i] == e.ids[i];
    CHECK(prefix);
    free(ids);
    cJSON_Delete(msgs);
    at_encoded_free(&e);
    at_dataset_free(ds);
    at_text_pipeline_free(&p);
    at_chat_template_free(ct);
    at_tokenizer_free(tok);
}

/* A byte-level BPE tokenizer whose end-of-turn token is an added special token. */
static void test_chatml_bpe(void)
{
    at_tokenizer *tok = NULL;
    at_chat_template *ct = NULL;
    CHECK_OK(at_tokenizer_load("tests/data/tokenizers/qwen3", NULL, &tok));
    CHECK_OK(at_chat_template_builtin("chatml", NULL, &ct));
    if (!tok || !ct) return;
    int32_t im_end = at_tokenizer_special_id(tok, "<|im_end|>");
    CHECK(im_end >= 0);
    at_text_pipeline p;
    CHECK_OK(at_text_pipeline_init(&p, tok, ct, 0));
    at_encoder enc;
    at_text_pipeline_encoder(&p, &enc);
    at_sample s;
    memset(&s, 0, sizeof s);
    at_message msgs[4] = {{AT_ROLE_USER, "Hello there", NULL, -1},
                          {AT_ROLE_ASSISTANT, "Hi! How can I help?", NULL, -1},
                          {AT_ROLE_USER, "Say yes", NULL, -1},
                          {AT_ROLE_ASSISTANT, "yes", NULL, 0}};
    s.kind = AT_SAMPLE_CONVERSATION;
    s.source = "inline";
    s.line = 1;
    s.messages.items = msgs;
    s.messages.n = 4;
    at_encoded e = {0};
    int dropped = 0;
    CHECK_OK(at_encode_sample(&enc, &s, &e, &dropped));
    char *lab = labelled_text(tok, &e);
    /* the first answer with its <|im_end|> and newline; the second has loss 0 */
    CHECK_MSG(lab && !strcmp(lab, "Hi! How can I help?<|im_end|>\n"), "[%s]", lab ? lab : "");
    free(lab);
    /* --system (ms-swift's): a conversation without a system message gets it,
     * and the labels stay on the same (shifted) assistant turns */
    size_t n_plain = e.n;
    at_encoded_free(&e);
    p.system = "You are terse.";
    CHECK_OK(at_encode_sample(&enc, &s, &e, &dropped));
    lab = labelled_text(tok, &e);
    CHECK_MSG(lab && !strcmp(lab, "Hi! How can I help?<|im_end|>\n"), "[%s]", lab ? lab : "");
    free(lab);
    char *all = NULL;
    size_t all_len = 0;
    CHECK_OK(at_tokenizer_decode(tok, e.ids, e.n, 0, &all, &all_len));
    CHECK_MSG(all && !strncmp(all, "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello", 62),
              "[%s]", all ? all : "");
    CHECK(e.n > n_plain);
    free(all);
    at_encoded_free(&e);
    at_text_pipeline_free(&p);
    at_chat_template_free(ct);
    at_tokenizer_free(tok);
}

int main(void)
{
    test_demo_model();
    test_chatml_bpe();
    return at_test_result("test_text_pipeline");
}
