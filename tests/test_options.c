/* Options: ms-swift names, hyphen aliases, config files (YAML and JSON), the
 * command line winning, typed validation, and helpful errors. */
#include <string.h>
#include "base/options.h"
#include "testing.h"

static const at_opt_spec specs[] = {
    {"model", AT_OPT_STRING, NULL, "model folder", NULL},
    {"train_type", AT_OPT_STRING, "lora", "lora|full", "tuner_type"},
    {"lora_rank", AT_OPT_INT, "8", "rank", NULL},
    {"learning_rate", AT_OPT_FLOAT, "1e-4", "lr", NULL},
    {"packing", AT_OPT_BOOL, "false", "pack samples", NULL},
    {"gradient_checkpointing", AT_OPT_BOOL, "true", "recompute", NULL},
    {"max_grad_norm", AT_OPT_FLOAT, "1.0", "clip", NULL},
    {"target_modules", AT_OPT_LIST, "all-linear", "modules", NULL},
    {"dataset", AT_OPT_LIST, NULL, "datasets", NULL},
};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))

static at_status parse(at_options **o, int argc, const char **argv)
{
    return at_options_parse(specs, NSPECS, argc, (char **)argv, o);
}

int main(void)
{
    at_options *o = NULL;
    /* defaults */
    const char *a0[] = {"sft"};
    CHECK_OK(parse(&o, 1, a0));
    CHECK(at_opt_int(o, "lora_rank") == 8 && at_opt_source_of(o, "lora_rank") == AT_SRC_DEFAULT);
    CHECK(at_opt_bool(o, "gradient_checkpointing") == 1 && at_opt_bool(o, "packing") == 0);
    CHECK(at_opt_list_count(o, "target_modules") == 1);
    CHECK(at_opt_str(o, "model") == NULL);
    at_options_free(o);

    /* command line: both spellings, =value, bare bool, alias, lists */
    const char *a1[] = {"sft", "--lora-rank", "16", "--learning_rate=3e-5", "--packing", "--tuner_type", "full",
                        "--target_modules", "q_proj,k_proj", "--dataset", "a.jsonl", "b.jsonl#5",
                        "--gradient_checkpointing", "false"};
    CHECK_OK(parse(&o, 14, a1));
    CHECK(at_opt_int(o, "lora_rank") == 16 && at_opt_source_of(o, "lora_rank") == AT_SRC_CLI);
    CHECK(at_opt_float(o, "learning_rate") == 3e-5);
    CHECK(at_opt_bool(o, "packing") == 1);
    CHECK(!strcmp(at_opt_str(o, "train_type"), "full"));
    CHECK(at_opt_list_count(o, "target_modules") == 2 && !strcmp(at_opt_list_get(o, "target_modules", 1), "k_proj"));
    CHECK(at_opt_list_count(o, "dataset") == 2 && !strcmp(at_opt_list_get(o, "dataset", 1), "b.jsonl#5"));
    CHECK(at_opt_bool(o, "gradient_checkpointing") == 0);
    cJSON *j = at_options_to_json(o);
    CHECK(cJSON_GetObjectItem(j, "lora_rank")->valuedouble == 16);
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "packing")));
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "model")));
    cJSON_Delete(j);
    at_options_free(o);

    /* YAML config, with the command line winning over it */
    const char *a2[] = {"sft", "--config", "tests/data/config/run.yaml", "--learning_rate", "1e-3"};
    CHECK_OK(parse(&o, 5, a2));
    if (o) {
        CHECK(!strcmp(at_opt_str(o, "model"), "models/tiny"));
        CHECK(at_opt_int(o, "lora_rank") == 16 && at_opt_source_of(o, "lora_rank") == AT_SRC_CONFIG);
        CHECK(at_opt_float(o, "learning_rate") == 1e-3 && at_opt_source_of(o, "learning_rate") == AT_SRC_CLI);
        CHECK(at_opt_bool(o, "packing") == 1);
        CHECK(at_opt_list_count(o, "target_modules") == 2);
        CHECK(at_opt_list_count(o, "dataset") == 2 && !strcmp(at_opt_list_get(o, "dataset", 1), "b.json#100"));
        at_options_free(o);
    }
    /* JSON config: alias key, numbers, booleans */
    const char *a3[] = {"sft", "--config=tests/data/config/run.json"};
    CHECK_OK(parse(&o, 2, a3));
    if (o) {
        CHECK(at_opt_int(o, "lora_rank") == 4 && !strcmp(at_opt_str(o, "train_type"), "full"));
        CHECK(at_opt_float(o, "max_grad_norm") == 0 && at_opt_bool(o, "gradient_checkpointing") == 0);
        at_options_free(o);
    }
    /* errors */
    const char *e1[] = {"sft", "--lora_rnak", "4"};
    CHECK_FAILS(parse(&o, 3, e1), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "did you mean '--lora_rank'") != NULL, "%s", at_last_error());
    const char *e2[] = {"sft", "--lora_rank", "eight"};
    CHECK_FAILS(parse(&o, 3, e2), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "integer") != NULL);
    const char *e3[] = {"sft", "--learning_rate"};
    CHECK_FAILS(parse(&o, 2, e3), AT_ERR_INVALID);
    const char *e4[] = {"sft", "stray"};
    CHECK_FAILS(parse(&o, 2, e4), AT_ERR_INVALID);
    const char *e5[] = {"sft", "--config", "tests/data/config/bad.yaml"};
    CHECK_FAILS(parse(&o, 3, e5), AT_ERR_FORMAT);
    CHECK_MSG(strstr(at_last_error(), "bad.yaml: line") != NULL, "%s", at_last_error());
    const char *e6[] = {"sft", "--config", "tests/data/config/badtype.yaml"};
    CHECK_FAILS(parse(&o, 3, e6), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "badtype.yaml:1") != NULL, "%s", at_last_error());
    const char *e7[] = {"sft", "--config", "tests/data/config/typo.yaml"};
    CHECK_FAILS(parse(&o, 3, e7), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "lora_rank") != NULL);
    const char *e8[] = {"sft", "--config", "tests/data/config/missing.yaml"};
    CHECK_FAILS(parse(&o, 3, e8), AT_ERR_IO);
    const char *e9[] = {"sft", "--config", "tests/data/config/run.toml"};
    CHECK_FAILS(parse(&o, 3, e9), AT_ERR_INVALID);
    return at_test_result("test_options");
}
