/* Images in datasets: the ms-swift, OpenAI and LLaVA record forms, paths
 * relative to the dataset file, tags against images, and the image tokens of
 * Qwen2-VL's template expanded with labels only on the assistant's text. */
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "data/dataset.h"
#include "data/media.h"
#include "testing.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/text_pipeline.h"

#define VDIR "tests/data/datasets/vision"

static at_dataset *load_vlm(void) {
    const char *spec = VDIR "/vlm.jsonl";
    at_dataset_options o = {0};
    o.seed = 42;
    o.strict = 1;
    at_dataset *ds = NULL;
    CHECK_OK(at_dataset_load(&spec, 1, &o, &ds));
    return ds;
}

static void test_forms(at_dataset *ds) {
    CHECK(ds->train.n == 5);
    if (ds->train.n != 5) return;
    const at_sample *const *s = ds->train.items;
    /* ms-swift: the tag stays in the text, the path is made relative to the file */
    CHECK(s[0]->n_images == 1 && !strcmp(s[0]->images[0], VDIR "/images/red.png"));
    CHECK(!strcmp(s[0]->messages.items[0].content, "<image>What colour is this?"));
    /* two images, the second inline as a data URL (kept as written) */
    CHECK(s[1]->n_images == 2 && !strncmp(s[1]->images[1], "data:image/png;base64,", 22));
    CHECK(at_media_count_tags(&s[1]->messages) == 2);
    /* OpenAI content list: the image part becomes a tag where it stood */
    CHECK(s[2]->n_images == 1 && !strcmp(s[2]->images[0], VDIR "/images/wide.jpg"));
    CHECK(!strcmp(s[2]->messages.items[0].content, "<image>Describe it."));
    /* LLaVA: conversations + image */
    CHECK(s[3]->n_images == 1 && !strcmp(s[3]->images[0], VDIR "/images/red.png"));
    CHECK(s[3]->messages.n == 2 && s[3]->messages.items[1].role == AT_ROLE_ASSISTANT);
    /* images without tags: put before the first user message's text */
    CHECK(s[4]->n_images == 1 && !strcmp(s[4]->messages.items[0].content, "<image>Name the colour."));
}

/* Records that must be refused, and the word their message must hold. */
static void test_bad_records(void) {
    static const struct {
        const char *json, *word;
    } cases[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"<image><image>x\"}, {\"role\": \"assistant\", "
         "\"content\": \"y\"}], \"images\": [\"a.png\"]}", "2 <image> tags for 1 image"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"<image>x\"}, {\"role\": \"assistant\", "
         "\"content\": \"y\"}], \"images\": [\"https://example.com/a.jpg\"]}", "never downloaded"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video\", \"video\": \"v.mp4\"}]}, "
         "{\"role\": \"assistant\", \"content\": \"y\"}]}", "\"video\""},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"image\": \"a.png\"}]}, "
         "{\"role\": \"assistant\", \"content\": \"y\"}], \"images\": [\"b.png\"]}", "both"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"<image>x\"}, {\"role\": \"assistant\", "
         "\"content\": \"y\"}], \"images\": [3]}", "images[0]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        at_arena arena = {0};
        at_normalizer nz = {&arena, NULL, NULL, NULL, NULL, NULL, "data"};
        cJSON *rec = NULL;
        CHECK_OK(at_json_parse(cases[i].json, strlen(cases[i].json), "rec", &rec));
        at_sample s;
        at_issue_kind kind;
        at_status st = at_normalize_record(&nz, rec, AT_FORMAT_AUTO, &s, &kind);
        CHECK_MSG(st != AT_OK && strstr(at_last_error(), cases[i].word), "case %zu: %s: %s", i, at_status_name(st),
                  at_last_error());
        cJSON_Delete(rec);
        at_arena_free(&arena);
    }
}

/* Without images, "<image>" is text like any other. */
static void test_text_only_tag(void) {
    static const char *json = "{\"messages\": [{\"role\": \"user\", \"content\": \"say <image>\"}, "
                              "{\"role\": \"assistant\", \"content\": \"<image>\"}]}";
    at_arena arena = {0};
    at_normalizer nz = {&arena, NULL, NULL, NULL, NULL, NULL, NULL};
    cJSON *rec = NULL;
    CHECK_OK(at_json_parse(json, strlen(json), "rec", &rec));
    at_sample s;
    at_issue_kind kind;
    CHECK_OK(at_normalize_record(&nz, rec, AT_FORMAT_AUTO, &s, &kind));
    CHECK(s.n_images == 0 && s.messages.n == 2 && !strcmp(s.messages.items[0].content, "say <image>"));
    cJSON_Delete(rec);
    at_arena_free(&arena);
}

static void test_base64(void) {
    uint8_t *b = NULL;
    size_t n = 0;
    CHECK_OK(at_base64_decode("aGVsbG8h\nd29ybGQ=", 17, &b, &n));
    CHECK(n == 11 && b && !memcmp(b, "hello!world", 11));
    free(b);
    CHECK_FAILS(at_base64_decode("aGVs*G8=", 8, &b, &n), AT_ERR_FORMAT);
    CHECK_FAILS(at_base64_decode("aGV=sbG8", 8, &b, &n), AT_ERR_FORMAT);
    at_image img;
    CHECK_FAILS(at_media_load_image("data:image/png,rawbytes", 0, &img), AT_ERR_FORMAT);
    CHECK_FAILS(at_media_load_image("data:image/png;base64,AAAA", 0, &img), AT_ERR_FORMAT);
    CHECK(strstr(at_last_error(), "base64 image") != NULL);
}

/* Token counts (hand-computed from smart_resize, factor 28, min 3136):
 * red 56x56 -> 56x56, grid 4x4 -> 4; green 28 wide, 84 high -> 56x112 (area
 * 2352 < 3136: scaled by sqrt(3136/2352), ceil) -> 8; wide 120x30 -> 112x28
 * -> 4; blue 60x40 -> 84x56 -> 6. */
static void test_tokens(at_dataset *ds) {
    at_image_processor p;
    at_image_processor_default(&p);
    static const size_t want[5][2] = {{4, 0}, {4, 8}, {4, 0}, {4, 0}, {6, 0}};
    for (size_t i = 0; i < ds->train.n && i < 5; i++) {
        const at_sample *s = ds->train.items[i];
        for (size_t k = 0; k < s->n_images; k++) {
            size_t t = 0;
            CHECK_OK(at_media_image_tokens(&p, s->images[k], 0, &t));
            CHECK_MSG(t == want[i][k], "sample %zu image %zu: %zu tokens, want %zu", i, k, t, want[i][k]);
        }
    }
}

/* The whole encoding with a real tokenizer (Qwen3's, which has Qwen2-VL's
 * vision tokens) and ChatML template: pads expanded, labels only on the
 * assistant's reply and its end of turn. */
static void test_encode(at_dataset *ds) {
    at_tokenizer *tok = NULL;
    at_chat_template *tmpl = NULL;
    CHECK_OK(at_tokenizer_load("tests/data/tokenizers/qwen3/tokenizer.json", NULL, &tok));
    CHECK_OK(at_chat_template_builtin("chatml", NULL, &tmpl));
    if (!tok || !tmpl) goto done;
    int32_t pad = at_tokenizer_token_to_id(tok, "<|image_pad|>");
    int32_t vs = at_tokenizer_token_to_id(tok, "<|vision_start|>"), ve = at_tokenizer_token_to_id(tok, "<|vision_end|>");
    CHECK(pad == 151655 && vs == 151652 && ve == 151653);
    at_text_pipeline tp;
    CHECK_OK(at_text_pipeline_init(&tp, tok, tmpl, 0));
    at_encoder enc;
    at_text_pipeline_encoder(&tp, &enc);
    const at_sample *s = ds->train.items[1]; /* two images: 4 and 8 tokens */
    size_t counts[2] = {4, 8};
    at_encoded e;
    int dropped = 1;
    CHECK_OK(at_media_encode(&enc, s, pad, counts, &e, &dropped));
    CHECK(!dropped);
    size_t n_pad = 0, n_vs = 0, n_ve = 0, run = 0, runs[2] = {0}, n_runs = 0, trained = 0;
    for (size_t i = 0; i < e.n; i++) {
        if (e.ids[i] == pad) {
            n_pad++;
            run++;
            CHECK(e.labels[i] == AT_IGNORE_INDEX);
        } else {
            if (run && n_runs < 2) runs[n_runs++] = run;
            run = 0;
        }
        n_vs += e.ids[i] == vs;
        n_ve += e.ids[i] == ve;
        if (e.labels[i] != AT_IGNORE_INDEX) {
            trained++;
            CHECK(e.labels[i] == e.ids[i]);
        }
    }
    CHECK(n_pad == 12 && n_vs == 2 && n_ve == 2 && runs[0] == 4 && runs[1] == 8);
    /* trained: "The second." and <|im_end|> (and nothing of the user's turn) */
    int32_t *ids = NULL;
    size_t n_reply = 0;
    CHECK_OK(at_tokenizer_encode(tok, "The second.", 11, 0, &ids, &n_reply));
    CHECK_MSG(trained >= n_reply + 1 && trained <= n_reply + 2, "%zu trained tokens for a reply of %zu", trained,
              n_reply);
    free(ids);
    at_encoded_free(&e);
    /* max_length counts the image tokens: a sample over it is dropped */
    enc.max_length = 20;
    enc.truncation = AT_TRUNCATE_LEFT;
    CHECK_OK(at_media_encode(&enc, s, pad, counts, &e, &dropped));
    CHECK(dropped == 1 && e.n == 0);
    /* placeholders that do not match the images are refused */
    int32_t *ids3 = malloc(3 * sizeof *ids3), *lab3 = malloc(3 * sizeof *lab3);
    if (ids3 && lab3) {
        ids3[0] = 1, ids3[1] = pad, ids3[2] = 2;
        lab3[0] = lab3[1] = lab3[2] = 5;
        at_encoded three = {ids3, lab3, 3};
        CHECK_FAILS(at_media_expand_pads(&three, pad, counts, 2), AT_ERR_INVALID);
        CHECK_OK(at_media_expand_pads(&three, pad, counts + 1, 1));
        CHECK(three.n == 10 && three.ids[0] == 1 && three.ids[9] == 2 && three.labels[9] == 5 &&
              three.labels[4] == AT_IGNORE_INDEX && three.ids[4] == pad);
        at_encoded_free(&three);
    }
    at_text_pipeline_free(&tp);
done:
    at_chat_template_free(tmpl);
    at_tokenizer_free(tok);
}

int main(void) {
    at_dataset *ds = load_vlm();
    if (ds) {
        test_forms(ds);
        test_tokens(ds);
        test_encode(ds);
        at_dataset_free(ds);
    }
    test_bad_records();
    test_text_only_tag();
    test_base64();
    return at_test_result("media");
}
