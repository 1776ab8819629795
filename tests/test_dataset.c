/* Dataset readers: every format on the real LLaMA-Factory demo files
 * (tests/data/datasets, see SOURCES.md there), the ms-swift and TRL forms on
 * small inline files, #N sampling, mixing, splitting, and bad input. Expected
 * counts, lines and texts were read off the files themselves. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "base/log.h"
#include "data/dataset.h"
#include "testing.h"

#define DIR "tests/data/datasets/"

static char g_tmp[256];

static const char *tmp_file(const char *name, const char *data, size_t len)
{
    static char path[8][512];
    static int k;
    char *p = path[k++ % 8];
    snprintf(p, 512, "%s/%s", g_tmp, name);
    FILE *f = fopen(p, "wb");
    if (f) {
        fwrite(data, 1, len, f);
        fclose(f);
    }
    return p;
}
#define TMP(name, lit) tmp_file(name, lit, sizeof(lit) - 1)

static at_dataset *load1(const char *spec, const at_dataset_options *o)
{
    at_dataset *ds = NULL;
    at_status st = at_dataset_load(&spec, 1, o, &ds);
    if (st != AT_OK) fprintf(stderr, "load %s: %s\n", spec, at_last_error());
    return ds;
}

static int starts(const char *s, const char *prefix) { return s && strncmp(s, prefix, strlen(prefix)) == 0; }
static int has(const char *s, const char *needle) { return s && strstr(s, needle) != NULL; }

static void test_alpaca(void)
{
    at_dataset *ds = load1(DIR "alpaca_en_demo.json", NULL);
    CHECK(ds != NULL);
    if (!ds) return;
    CHECK(ds->train.n == 100 && ds->val.n == 0 && ds->n_skipped == 0);
    const at_sample *s = ds->train.items[0];
    CHECK(s->kind == AT_SAMPLE_CONVERSATION && s->line == 2);
    CHECK(s->messages.n == 2);
    CHECK(s->messages.items[0].role == AT_ROLE_USER);
    CHECK(strcmp(s->messages.items[0].content, "Describe a process of making crepes.") == 0);
    CHECK(s->messages.items[1].role == AT_ROLE_ASSISTANT);
    CHECK(starts(s->messages.items[1].content, "Making crepes is an easy and delicious process! Here are step-by-step "
                                              "instructions on how to make them:\n\n1. Assemble your ingredients."));
    s = ds->train.items[1];
    CHECK(s->line == 7 && strcmp(s->messages.items[1].content, "The car accelerated rapidly.") == 0);
    /* instruction + "\n" + input */
    s = ds->train.items[5];
    CHECK(strcmp(s->messages.items[0].content,
                 "Given the parameters of a triangle, find out its perimeter.\nSide 1 = 4\nSide 2 = 6\nSide 3 = 8") == 0);
    s = ds->train.items[99];
    CHECK(s->line == 497);
    CHECK(has(s->messages.items[1].content, "Area = Length \xC3\x97 Width")); /* \u00d7 decoded */
    CHECK(has(ds->summary, "100 train + 0 val"));
    at_dataset_free(ds);

    ds = load1(DIR "alpaca_zh_demo.json", NULL);
    CHECK(ds && ds->train.n == 50);
    if (ds) {
        CHECK(strcmp(ds->train.items[0]->messages.items[0].content,
                     "识别并解释给定列表中的两个科学理论：细胞理论和日心说。") == 0);
        CHECK(ds->train.items[49]->line == 247);
    }
    at_dataset_free(ds);
}

static void test_identity_placeholders(void)
{
    at_dataset *ds = load1(DIR "identity.json", NULL);
    CHECK(ds && ds->train.n == 91);
    if (ds) {
        CHECK(strcmp(ds->train.items[0]->messages.items[0].content, "hi") == 0);
        CHECK(strcmp(ds->train.items[0]->messages.items[1].content,
                     "Hello! I am {{name}}, an AI assistant developed by {{author}}. How can I assist you today?") == 0);
    }
    at_dataset_free(ds);
    at_dataset_options o = {.seed = 42, .model_name = "Anytune", .model_author = "the anytune team"};
    ds = load1(DIR "identity.json", &o);
    CHECK(ds && ds->train.n == 91);
    if (ds)
        CHECK(strcmp(ds->train.items[0]->messages.items[1].content,
                     "Hello! I am Anytune, an AI assistant developed by the anytune team. How can I assist you today?") == 0);
    at_dataset_free(ds);
    /* ms-swift's two-value form: the first value for Chinese records (tag
     * "zh", or CJK text), the second for the others (issue 21.7) */
    const char *two = TMP("self_cognition.jsonl",
                          "{\"query\": \"你是谁？\", \"response\": \"我是{{NAME}}，由{{AUTHOR}}训练。\"}\n"
                          "{\"query\": \"who are you?\", \"response\": \"I am {{NAME}}, by {{AUTHOR}}.\"}\n"
                          "{\"query\": \"hi\", \"response\": \"{{NAME}}\", \"tag\": \"zh\"}\n");
    at_dataset_options o2 = {.seed = 42, .model_name = "小黄", .model_name_en = "Xiao Huang", .model_author = "魔搭",
                             .model_author_en = "ModelScope"};
    ds = load1(two, &o2);
    CHECK(ds && ds->train.n == 3);
    if (ds && ds->train.n == 3) {
        CHECK(!strcmp(ds->train.items[0]->messages.items[1].content, "我是小黄，由魔搭训练。"));
        CHECK_MSG(!strcmp(ds->train.items[1]->messages.items[1].content, "I am Xiao Huang, by ModelScope."), "%s",
                  ds->train.items[1]->messages.items[1].content);
        CHECK(!strcmp(ds->train.items[2]->messages.items[1].content, "小黄"));
    }
    at_dataset_free(ds);
}

static void test_sharegpt_tools(void)
{
    at_dataset *ds = load1(DIR "glaive_toolcall_en_demo.json", NULL);
    CHECK(ds && ds->train.n == 40);
    if (!ds) return;
    const at_sample *s = ds->train.items[0];
    static const at_role roles[8] = {AT_ROLE_USER, AT_ROLE_ASSISTANT, AT_ROLE_USER, AT_ROLE_ASSISTANT,
                                     AT_ROLE_TOOL, AT_ROLE_ASSISTANT, AT_ROLE_USER, AT_ROLE_ASSISTANT};
    CHECK(s->kind == AT_SAMPLE_CONVERSATION && s->messages.n == 8);
    for (size_t i = 0; i < 8 && i < s->messages.n; i++) CHECK(s->messages.items[i].role == roles[i]);
    CHECK(strcmp(s->messages.items[0].content,
                 "Hi, I have some ingredients and I want to cook something. Can you help me find a recipe?") == 0);
    /* function_call -> assistant tool_calls (OpenAI form) */
    const at_message *call = &s->messages.items[3];
    CHECK(call->tool_calls != NULL && strcmp(call->content, "") == 0);
    cJSON *tc = call->tool_calls ? cJSON_Parse(call->tool_calls) : NULL;
    const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(tc, 0), "function");
    CHECK(cJSON_GetArraySize(tc) == 1);
    CHECK(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(tc, 0), "type")), "function") == 0);
    CHECK(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(fn, "name")), "search_recipes") == 0);
    CHECK(strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(
                     cJSON_GetObjectItem(cJSON_GetObjectItem(fn, "arguments"), "ingredients"), 2)), "rice") == 0);
    cJSON_Delete(tc);
    CHECK(starts(s->messages.items[4].content, "{\"recipes\": [{\"name\": \"Chicken and Bell Pepper Stir Fry\""));
    cJSON *tools = s->tools ? cJSON_Parse(s->tools) : NULL;
    CHECK(cJSON_IsArray(tools) && strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(tools, 0),
                                                                                   "name")), "search_recipes") == 0);
    cJSON_Delete(tools);
    size_t no_tools = 0;
    for (size_t i = 0; i < ds->train.n; i++) no_tools += ds->train.items[i]->tools == NULL;
    CHECK(no_tools == 16);

    /* OpenAI-style array for the chat template */
    cJSON *j = NULL;
    CHECK_OK(at_messages_to_json(&s->messages, &j));
    CHECK(cJSON_GetArraySize(j) == 8);
    CHECK(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 4), "role")), "tool") == 0);
    CHECK(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "content")),
                 s->messages.items[0].content) == 0);
    CHECK(cJSON_IsArray(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 3), "tool_calls")));
    CHECK(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 2), "tool_calls") == NULL);
    cJSON_Delete(j);
    at_dataset_free(ds);
}

/* A function call or a tools list given as text is parsed strictly: data
 * after the JSON value makes the record bad (a lenient parser took the value
 * and dropped the rest, so a damaged call trained as a different one). */
static void test_tool_text_strict(void)
{
#define CONV(call) \
    "{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, {\"from\": \"function_call\", \"value\": \"" call \
    "\"}, {\"from\": \"observation\", \"value\": \"{}\"}, {\"from\": \"gpt\", \"value\": \"ok\"}]"
    const char *p = TMP("tool_text.jsonl",
        CONV("{\\\"name\\\": \\\"f\\\", \\\"arguments\\\": {}}") "}\n"
        CONV("{\\\"name\\\": \\\"f\\\", \\\"arguments\\\": {}} x") "}\n"
        CONV("{\\\"name\\\": \\\"f\\\", \\\"arguments\\\": {}}") ", \"tools\": \"[{\\\"name\\\": \\\"f\\\"}]\"}\n"
        CONV("{\\\"name\\\": \\\"f\\\", \\\"arguments\\\": {}}") ", \"tools\": \"[{\\\"name\\\": \\\"f\\\"}] x\"}\n");
#undef CONV
    at_dataset *ds = load1(p, NULL);
    CHECK(ds && ds->train.n == 2 && ds->n_skipped == 2);
    if (ds && ds->train.n == 2 && ds->n_issues == 2) {
        CHECK(ds->train.items[0]->line == 1 && ds->train.items[1]->line == 3);
        CHECK(ds->train.items[1]->tools != NULL);
        char want[600];
        snprintf(want, sizeof want, "%s:2:", p);
        CHECK_MSG(starts(ds->issues[0], want) && has(ds->issues[0], "a function call must be JSON"), "%s",
                  ds->issues[0]);
        snprintf(want, sizeof want, "%s:4:", p);
        CHECK_MSG(starts(ds->issues[1], want) && has(ds->issues[1], "\"tools\" is not a JSON list"), "%s",
                  ds->issues[1]);
    }
    at_dataset_free(ds);
}

static void test_dpo_and_kto(void)
{
    at_dataset *ds = load1(DIR "dpo_en_demo.json", NULL);
    CHECK(ds && ds->train.n == 40);
    if (ds) {
        const at_sample *s = ds->train.items[0];
        CHECK(s->kind == AT_SAMPLE_PREFERENCE && s->line == 2);
        CHECK(s->messages.n == 1 && s->messages.items[0].role == AT_ROLE_USER);
        CHECK(strcmp(s->messages.items[0].content, "Hi! I'd like to create a new language game simulating the first "
                                                   "person perspective of a character named Angela.") == 0);
        CHECK(s->chosen.n == 1 && s->chosen.items[0].role == AT_ROLE_ASSISTANT);
        CHECK(starts(s->chosen.items[0].content, "That sounds like a fun and engaging idea! Here are some tips"));
        CHECK(s->rejected.n == 1 && starts(s->rejected.items[0].content,
                                           "Hello! I'd be happy to help you create a language game simulating"));
        s = ds->train.items[1];
        CHECK(s->line == 18 && s->messages.n == 2 && s->messages.items[0].role == AT_ROLE_SYSTEM);
        CHECK(starts(s->messages.items[0].content, "You are a teacher. Given a task, you explain in simple steps"));
        CHECK(starts(s->messages.items[1].content, "Q: In this task, you need to provide the parts-of-speech tag"));
    }
    at_dataset_free(ds);

    ds = load1(DIR "kto_en_demo.json", NULL);
    CHECK(ds && ds->train.n == 30);
    if (ds) {
        size_t good = 0;
        for (size_t i = 0; i < ds->train.n; i++) good += ds->train.items[i]->label == 1;
        CHECK(good == 19);
        CHECK(ds->train.items[1]->line == 15);
        CHECK(starts(ds->train.items[1]->messages.items[0].content,
                     "Compare and contrast the roles of the hippocampus and the pr"));
    }
    at_dataset_free(ds);
}

static void test_text(void)
{
    at_dataset *ds = load1(DIR "c4_demo.jsonl", NULL);
    CHECK(ds && ds->train.n == 50);
    if (ds) {
        CHECK(ds->train.items[0]->kind == AT_SAMPLE_TEXT);
        CHECK(starts(ds->train.items[0]->text, "Don\xE2\x80\x99t think you need all the bells and whistles? No problem."));
        CHECK(ds->train.items[1]->line == 2 && ds->train.items[49]->line == 50);
        CHECK(starts(ds->train.items[1]->text, "To the apparent surprise of everyone, the Walt Disney Company"));
    }
    at_dataset_free(ds);
    ds = load1(DIR "wiki_demo.txt", NULL);
    CHECK(ds && ds->train.n == 4);
    if (ds) {
        CHECK(starts(ds->train.items[0]->text, "Anarchism is a political philosophy and movement that is sce"));
        CHECK(starts(ds->train.items[3]->text, "A, or a, is the first letter and the first vowel of the mode"));
        CHECK(ds->train.items[2]->line == 3 && strlen(ds->train.items[0]->text) == 43804);
    }
    at_dataset_free(ds);
}

static void test_csv(void)
{
    at_dataset *ds = load1(DIR "art_studies_dev.csv", NULL);
    CHECK(ds && ds->train.n == 5);
    if (ds) {
        const at_sample *s = ds->train.items[0];
        CHECK(s->line == 2 && s->messages.n == 2);
        CHECK(strcmp(s->messages.items[0].content, "王利发是老舍戏剧作品____中的主人公。") == 0);
        CHECK(strcmp(s->messages.items[1].content, "A") == 0);
        CHECK(strcmp(ds->train.items[1]->messages.items[1].content, "B") == 0);
    }
    at_dataset_free(ds);
    /* quoting, doubled quotes, a newline inside a field, CRLF, a bad row */
    const char *p = TMP("qa.csv", "query,response\r\n\"a, \"\"b\"\"\",\"line1\nline2\"\r\nx,y,z\r\nq2,r2\r\n");
    ds = load1(p, NULL);
    CHECK(ds && ds->train.n == 2 && ds->n_skipped == 1);
    if (ds) {
        CHECK(strcmp(ds->train.items[0]->messages.items[0].content, "a, \"b\"") == 0);
        CHECK(strcmp(ds->train.items[0]->messages.items[1].content, "line1\nline2") == 0);
        CHECK(ds->train.items[1]->line == 5);
        char want[600];
        snprintf(want, sizeof want, "%s:4: malformed CSV: the row has 3 fields, the header 2", p);
        CHECK_MSG(ds->n_issues == 1 && strcmp(ds->issues[0], want) == 0, "%s", ds->n_issues ? ds->issues[0] : "");
    }
    at_dataset_free(ds);
}

static void test_other_forms(void)
{
    /* ms-swift messages + rejected_response; rejected_messages; TRL strings;
     * TRL implicit prompt; LLaMA-Factory alpaca ranking */
    const char *p = TMP("pref.jsonl",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Q\"}, "
        "{\"role\": \"assistant\", \"content\": \"good\"}], \"rejected_response\": \"bad\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"good\"}], "
        "\"rejected_messages\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"bad\"}]}\n"
        "{\"prompt\": \"Q\", \"chosen\": \"good\", \"rejected\": \"bad\"}\n"
        "{\"chosen\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"good\"}], "
        "\"rejected\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"bad\"}]}\n"
        "{\"instruction\": \"I\", \"input\": \"N\", \"chosen\": \"good\", \"rejected\": \"bad\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"same\"}], "
        "\"rejected_response\": \"same\"}\n");
    at_dataset *ds = load1(p, NULL);
    CHECK(ds && ds->train.n == 5 && ds->n_skipped == 1);
    for (size_t i = 0; ds && i < ds->train.n; i++) {
        const at_sample *s = ds->train.items[i];
        CHECK(s->kind == AT_SAMPLE_PREFERENCE);
        CHECK(s->chosen.n == 1 && strcmp(s->chosen.items[0].content, "good") == 0);
        CHECK(s->rejected.n == 1 && strcmp(s->rejected.items[0].content, "bad") == 0);
        CHECK(s->messages.n >= 1 && s->messages.items[s->messages.n - 1].role == AT_ROLE_USER);
        const char *q = s->messages.items[s->messages.n - 1].content;
        CHECK_MSG(strcmp(q, i == 4 ? "I\nN" : "Q") == 0, "record %zu: prompt %s", i, q);
    }
    if (ds) {
        CHECK(ds->train.items[0]->messages.n == 2 && strcmp(ds->train.items[0]->messages.items[0].content, "S") == 0);
        CHECK(ds->n_issues == 1 && has(ds->issues[0], ":6: \"rejected_response\" equals the chosen reply"));
    }
    at_dataset_free(ds);

    /* response aliases with system and history; sharegpt pair style; OpenAI
     * tool_calls with null content; pre-tokenized */
    p = TMP("conv.jsonl",
        "{\"system\": \"S\", \"history\": [[\"q1\", \"r1\"]], \"query\": \"q2\", \"response\": \"r2\"}\n"
        "{\"conversations\": [{\"human\": \"h\", \"assistant\": \"a\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"w\"}, {\"role\": \"assistant\", \"content\": null, "
        "\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}, "
        "{\"role\": \"tool\", \"content\": \"42\"}, {\"role\": \"assistant\", \"content\": \"done\", \"loss\": false}]}\n");
    at_dataset_options o = {.seed = 42, .format = AT_FORMAT_AUTO};
    /* the first record decides the file's format: response; the others
     * then fail it, so load them one per file */
    ds = load1(p, &o);
    CHECK(ds && ds->train.n == 1 && ds->n_skipped == 2);
    if (ds) {
        const at_messages *m = &ds->train.items[0]->messages;
        static const char *want[5] = {"S", "q1", "r1", "q2", "r2"};
        static const at_role wr[5] = {AT_ROLE_SYSTEM, AT_ROLE_USER, AT_ROLE_ASSISTANT, AT_ROLE_USER, AT_ROLE_ASSISTANT};
        CHECK(m->n == 5);
        for (size_t i = 0; i < 5 && i < m->n; i++) CHECK(strcmp(m->items[i].content, want[i]) == 0 && m->items[i].role == wr[i]);
    }
    at_dataset_free(ds);
    p = TMP("pairs.jsonl", "{\"conversations\": [{\"human\": \"h\", \"assistant\": \"a\"}]}\n"
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"w\"}, {\"role\": \"assistant\", "
                           "\"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                           "\"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"content\": \"42\"}, {\"role\": "
                           "\"assistant\", \"content\": \"done\", \"loss\": false}]}\n");
    ds = load1(p, NULL);
    CHECK(ds && ds->train.n == 2);
    if (ds) {
        const at_messages *m = &ds->train.items[0]->messages;
        CHECK(m->n == 2 && m->items[0].role == AT_ROLE_USER && strcmp(m->items[1].content, "a") == 0);
        m = &ds->train.items[1]->messages;
        CHECK(m->n == 4 && m->items[1].tool_calls && strcmp(m->items[1].content, "") == 0);
        CHECK(m->items[2].role == AT_ROLE_TOOL && m->items[3].loss == 0 && m->items[0].loss == -1);
    }
    at_dataset_free(ds);

    p = TMP("tok.jsonl", "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n{\"input_ids\": [7]}\n"
                         "{\"input_ids\": [1, 2], \"labels\": [1]}\n{\"input_ids\": [1.5]}\n");
    ds = load1(p, NULL);
    CHECK(ds && ds->train.n == 2 && ds->n_skipped == 2);
    if (ds) {
        const at_sample *s = ds->train.items[0];
        CHECK(s->kind == AT_SAMPLE_TOKENS && s->n_tokens == 3 && s->input_ids[2] == 3 && s->labels[0] == -100);
        CHECK(ds->train.items[1]->labels == NULL && ds->train.items[1]->input_ids[0] == 7);
        CHECK(ds->n_issues == 2 && has(ds->issues[0], ":3: \"labels\" has 1 entries, \"input_ids\" 2"));
        CHECK(has(ds->issues[1], ":4: input_ids[0] = 1.5 is not a valid token id"));
    }
    at_dataset_free(ds);
}

static int count_of(const at_sample_list *l, const at_sample *s)
{
    int c = 0;
    for (size_t i = 0; i < l->n; i++) c += l->items[i] == s;
    return c;
}

static void test_sampling_mixing_split(void)
{
    at_dataset_options o = {.seed = 42};
    at_dataset *a = load1(DIR "alpaca_en_demo.json#10", &o), *b = load1(DIR "alpaca_en_demo.json#10", &o);
    o.seed = 7;
    at_dataset *c = load1(DIR "alpaca_en_demo.json#10", &o);
    CHECK(a && b && c && a->train.n == 10 && c->train.n == 10);
    if (a && b && c) {
        int same_b = 1, same_c = 1;
        for (size_t i = 0; i < 10; i++) {
            CHECK(count_of(&a->train, a->train.items[i]) == 1); /* without replacement */
            same_b &= a->train.items[i]->line == b->train.items[i]->line;
            same_c &= a->train.items[i]->line == c->train.items[i]->line;
        }
        CHECK(same_b);
        CHECK(!same_c);
    }
    at_dataset_free(a);
    at_dataset_free(b);
    at_dataset_free(c);

    /* 250 of 100: every record twice, 50 of them a third time */
    o.seed = 42;
    a = load1(DIR "alpaca_en_demo.json#250", &o);
    CHECK(a && a->train.n == 250);
    if (a) {
        int hist[4] = {0};
        const at_sample *seen[100];
        size_t ns = 0;
        for (size_t i = 0; i < a->train.n; i++) {
            int dup = 0;
            for (size_t k = 0; k < ns; k++) dup |= seen[k] == a->train.items[i];
            if (!dup && ns < 100) {
                seen[ns++] = a->train.items[i];
                int cnt = count_of(&a->train, a->train.items[i]);
                if (cnt >= 0 && cnt < 4) hist[cnt]++;
            }
        }
        CHECK(ns == 100 && hist[2] == 50 && hist[3] == 50);
    }
    at_dataset_free(a);

    /* mixing keeps spec order */
    const char *specs[3] = {DIR "alpaca_en_demo.json#10", DIR "c4_demo.jsonl", DIR "identity.json"};
    at_dataset *ds = NULL;
    CHECK_OK(at_dataset_load(specs, 3, &o, &ds));
    if (ds) {
        CHECK(ds->train.n == 10 + 50 + 91 && ds->n_files == 3 && ds->n_records == 100 + 50 + 91);
        CHECK(ds->train.items[9]->kind == AT_SAMPLE_CONVERSATION && ds->train.items[10]->kind == AT_SAMPLE_TEXT);
        CHECK(ds->train.items[10]->line == 1 && ds->train.items[60]->line == 2);
        CHECK(has(ds->train.items[60]->source, "identity.json"));
    }
    at_dataset_free(ds);
    o.shuffle = 1;
    CHECK_OK(at_dataset_load(specs, 3, &o, &ds));
    if (ds) {
        size_t text = 0;
        for (size_t i = 0; i < 60; i++) text += ds->train.items[i]->kind == AT_SAMPLE_TEXT;
        CHECK(ds->train.n == 151 && text < 50); /* shuffled: the texts are spread out */
    }
    at_dataset_free(ds);
    o.shuffle = 0;

    /* split: ceil(0.1 * 50) = 5 held out, disjoint, deterministic */
    o.split_ratio = 0.1;
    a = load1(DIR "c4_demo.jsonl", &o);
    b = load1(DIR "c4_demo.jsonl", &o);
    o.seed = 1;
    c = load1(DIR "c4_demo.jsonl", &o);
    CHECK(a && b && c && a->train.n == 45 && a->val.n == 5);
    if (a && b && c) {
        int lines[51] = {0}, same = 1, same_c = 1;
        for (size_t i = 0; i < 45; i++) lines[a->train.items[i]->line]++;
        for (size_t i = 0; i < 5; i++) {
            lines[a->val.items[i]->line]++;
            same &= a->val.items[i]->line == b->val.items[i]->line;
            same_c &= a->val.items[i]->line == c->val.items[i]->line;
        }
        int all_once = 1;
        for (int l = 1; l <= 50; l++) all_once &= lines[l] == 1;
        CHECK(all_once && same && !same_c);
    }
    at_dataset_free(a);
    at_dataset_free(b);
    at_dataset_free(c);
    o.split_ratio = 1.0;
    CHECK_FAILS(at_dataset_load(specs, 1, &o, &ds), AT_ERR_INVALID);

    char *path = NULL;
    size_t n = 0;
    CHECK_OK(at_dataset_parse_spec("data/a#b.json", &path, &n));
    CHECK(path && strcmp(path, "data/a#b.json") == 0 && n == 0);
    free(path);
    CHECK_OK(at_dataset_parse_spec("x.jsonl#12", &path, &n));
    CHECK(path && strcmp(path, "x.jsonl") == 0 && n == 12);
    free(path);
    CHECK_FAILS(at_dataset_parse_spec("x.jsonl#0", &path, &n), AT_ERR_INVALID);
}

static void test_bad_records(void)
{
    /* JSONL: each bad line reported by line; blank lines ignored */
    const char *p = TMP("bad.jsonl",
        "{\"instruction\": \"a\", \"output\": \"b\"}\n"
        "{\"instruction\": \"a\", \"output\": }\n"
        "{\"instruction\": \"a\", \"output\": 5}\n"
        "{\"instruction\": \"\xC3\x28\", \"output\": \"b\"}\n"
        "\n"
        "{\"instruction\": \"c\", \"output\": \"d\"}\r\n"
        "[1, 2]\n"
        "{\"instruction\": \"a\"}\n");
    at_dataset *ds = load1(p, NULL);
    CHECK(ds && ds->train.n == 2 && ds->n_skipped == 5);
    if (ds) {
        char want[5][600];
        snprintf(want[0], 600, "%s:2:32: malformed JSON (record starting at line 2)", p);
        snprintf(want[1], 600, "%s:3: \"output\" must be a string, not a number", p);
        snprintf(want[2], 600, "%s:4:18: invalid UTF-8 (byte 0xc3)", p);
        snprintf(want[3], 600, "%s:7: a record must be a JSON object, not an array", p);
        snprintf(want[4], 600, "%s:8: no response (\"output\" or an alias)", p);
        CHECK(ds->n_issues == 5);
        for (size_t i = 0; i < 5 && i < ds->n_issues; i++)
            CHECK_MSG(strcmp(ds->issues[i], want[i]) == 0, "got   %s\nwant  %s", ds->issues[i], want[i]);
        CHECK(ds->train.items[1]->line == 6);
        CHECK(ds->skipped_by_kind[AT_ISSUE_SYNTAX] == 1 && ds->skipped_by_kind[AT_ISSUE_TYPE] == 2 &&
              ds->skipped_by_kind[AT_ISSUE_UTF8] == 1 && ds->skipped_by_kind[AT_ISSUE_MISSING] == 1);
        CHECK(has(ds->summary, "skipped 5 bad records"));
        CHECK(has(ds->summary, "2 wrong type"));
    }
    at_dataset_free(ds);
    at_dataset_options strict = {.seed = 42, .strict = 1};
    CHECK_FAILS(at_dataset_load(&p, 1, &strict, &ds), AT_ERR_FORMAT);
    CHECK(ds == NULL);
    char want[600];
    snprintf(want, sizeof want, "%s:2:32: malformed JSON", p);
    CHECK_MSG(starts(at_last_error(), want), "%s", at_last_error());

    /* a NUL (\u0000) would end the text there: the record is refused, never cut; an escaped
     * backslash before "u0000" is plain text and kept whole */
    p = TMP("nul.jsonl", "{\"instruction\": \"a\", \"output\": \"b\\u0000c\"}\n"
                         "{\"instruction\": \"a\\\\u0000\", \"output\": \"d\"}\n");
    ds = load1(p, NULL);
    CHECK(ds && ds->train.n == 1 && ds->n_skipped == 1);
    if (ds && ds->n_issues == 1) {
        snprintf(want, sizeof want, "%s:1:34: a NUL character", p);
        CHECK_MSG(starts(ds->issues[0], want), "%s", ds->issues[0]);
        CHECK(ds->train.n == 1 && !strcmp(ds->train.items[0]->messages.items[0].content, "a\\u0000"));
    }
    at_dataset_free(ds);

    /* JSON array: a bad record is reported at the line where it starts */
    p = TMP("bad.json", "\xEF\xBB\xBF[\n  {\"instruction\": \"a\", \"output\": \"b\"},\n  {\n    \"instruction\": \"a\",\n"
                        "    \"output\": 5\n  },\n  {\"instruction\": tru},\n  {\"instruction\": \"c\", \"output\": \"d\"}\n]\n");
    ds = load1(p, NULL);
    CHECK(ds && ds->train.n == 2 && ds->n_skipped == 2);
    if (ds) {
        snprintf(want, sizeof want, "%s:3: \"output\" must be a string, not a number", p);
        CHECK_MSG(ds->n_issues == 2 && strcmp(ds->issues[0], want) == 0, "%s", ds->issues[0]);
        snprintf(want, sizeof want, "%s:7:19: malformed JSON (record starting at line 7)", p);
        CHECK_MSG(ds->n_issues == 2 && strcmp(ds->issues[1], want) == 0, "%s", ds->issues[1]);
        CHECK(ds->train.items[1]->line == 8);
    }
    at_dataset_free(ds);
    CHECK_FAILS(at_dataset_load(&p, 1, &strict, &ds), AT_ERR_FORMAT);
    snprintf(want, sizeof want, "%s:3: \"output\" must be a string", p);
    CHECK_MSG(starts(at_last_error(), want), "%s", at_last_error());

    /* structural damage is fatal even when not strict: file, line, column */
    p = TMP("open.json", "[\n  {\"instruction\": \"a\", \"output\": \"b\"},\n  {\"instruction\": \"a\n");
    CHECK_FAILS(at_dataset_load(&p, 1, NULL, &ds), AT_ERR_FORMAT);
    snprintf(want, sizeof want, "%s:4:1: malformed JSON: unexpected end of file in the record starting at line 3", p);
    CHECK_MSG(strcmp(at_last_error(), want) == 0, "%s", at_last_error());
    p = TMP("sep.json", "[{\"text\": \"a\"}\n {\"text\": \"b\"}]");
    CHECK_FAILS(at_dataset_load(&p, 1, NULL, &ds), AT_ERR_FORMAT);
    snprintf(want, sizeof want, "%s:2:2: malformed JSON: expected ',' or ']' after a record", p);
    CHECK_MSG(strcmp(at_last_error(), want) == 0, "%s", at_last_error());

    /* empty inputs */
    p = TMP("empty.jsonl", "");
    CHECK_FAILS(at_dataset_load(&p, 1, NULL, &ds), AT_ERR_FORMAT);
    CHECK(has(at_last_error(), "holds no records"));
    p = TMP("empty.json", "\xEF\xBB\xBF  [ ]\n");
    CHECK_FAILS(at_dataset_load(&p, 1, NULL, &ds), AT_ERR_FORMAT);
    p = TMP("allbad.jsonl", "{\"foo\": 1}\n{\"bar\": 2}\n");
    CHECK_FAILS(at_dataset_load(&p, 1, NULL, &ds), AT_ERR_FORMAT);
    CHECK(has(at_last_error(), "no usable records (2 skipped;"));
    p = "tests/data/datasets/does-not-exist.json";
    CHECK_FAILS(at_dataset_load(&p, 1, NULL, &ds), AT_ERR_IO);
    /* invalid UTF-8 in a text file, an overlong form and a surrogate */
    p = TMP("bad.txt", "good line\n\xC0\xAF\n\xED\xA0\x80x\nlast\n");
    ds = load1(p, NULL);
    CHECK(ds && ds->train.n == 2 && ds->n_skipped == 2);
    if (ds) {
        snprintf(want, sizeof want, "%s:2:1: invalid UTF-8 (byte 0xc0)", p);
        CHECK(ds->n_issues == 2 && strcmp(ds->issues[0], want) == 0);
        CHECK(ds->train.items[1]->line == 4);
    }
    at_dataset_free(ds);
    /* a forced format that does not fit */
    at_dataset_options text = {.seed = 42, .format = AT_FORMAT_TEXT};
    p = DIR "identity.json";
    CHECK_FAILS(at_dataset_load(&p, 1, &text, &ds), AT_ERR_FORMAT);
    CHECK(has(at_last_error(), "identity.json: no usable records (91 skipped; the first: "
                               "tests/data/datasets/identity.json:2: no \"text\")"));
    at_data_format f;
    CHECK_OK(at_data_format_parse("sharegpt", &f));
    CHECK(f == AT_FORMAT_SHAREGPT);
    CHECK_FAILS(at_data_format_parse("nope", &f), AT_ERR_INVALID);
}

static void test_huge_line(void)
{
    size_t big = 6u << 20;
    char *buf = malloc(big + 64);
    CHECK(buf != NULL);
    if (!buf) return;
    size_t o = (size_t)sprintf(buf, "{\"text\": \"");
    for (size_t i = 0; i < big; i++) buf[o++] = (char)('a' + i % 26);
    o += (size_t)sprintf(buf + o, "\"}\n{\"text\": \"x\"}\n");
    const char *p = tmp_file("huge.jsonl", buf, o);
    free(buf);
    at_dataset *ds = load1(p, NULL);
    CHECK(ds && ds->train.n == 2);
    if (ds) CHECK(strlen(ds->train.items[0]->text) == big && ds->train.items[1]->line == 2);
    at_dataset_free(ds);
}

int main(void)
{
    at_log_set_level(AT_LOG_ERROR);
    const char *t = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/at_test_dataset_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_tmp)) {
        fprintf(stderr, "cannot create a temporary folder\n");
        return 1;
    }
    test_alpaca();
    test_identity_placeholders();
    test_sharegpt_tools();
    test_tool_text_strict();
    test_dpo_and_kto();
    test_text();
    test_csv();
    test_other_forms();
    test_sampling_mixing_split();
    test_bad_records();
    test_huge_line();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    return at_test_result("test_dataset");
}
