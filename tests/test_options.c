/* Options: ms-swift names, hyphen aliases, config files (YAML and JSON), the
 * command line winning, typed validation, and helpful errors. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "base/options.h"
#include "testing.h"
#include "train/grpo.h"
#include "train/train_options.h"
#include "train/trainer.h"

static const at_opt_spec specs[] = {
    {.name = "model", .type = AT_OPT_STRING, .help = "model folder"},
    {.name = "train_type", .type = AT_OPT_STRING, .def = "lora", .help = "lora|full", .alias = "tuner_type"},
    {.name = "lora_rank", .type = AT_OPT_INT, .def = "8", .help = "rank"},
    {.name = "learning_rate", .type = AT_OPT_FLOAT, .def = "1e-4", .help = "lr"},
    {.name = "packing", .type = AT_OPT_BOOL, .def = "false", .help = "pack samples"},
    {.name = "gradient_checkpointing", .type = AT_OPT_BOOL, .def = "true", .help = "recompute"},
    {.name = "max_grad_norm", .type = AT_OPT_FLOAT, .def = "1.0", .help = "clip"},
    {.name = "target_modules", .type = AT_OPT_LIST, .def = "all-linear", .help = "modules"},
    {.name = "dataset", .type = AT_OPT_LIST, .help = "datasets"},
    {.name = "adam_beta1", .type = AT_OPT_FLOAT, .def = "0.9", .help = "beta1", .range = "[0, 1)"},
    {.name = "epochs", .type = AT_OPT_FLOAT, .def = "3", .help = "epochs", .range = "(0, 1e6]"},
    {.name = "rank_wide", .type = AT_OPT_INT, .def = "8", .help = "rank", .range = "[1, 65536]"},
    {.name = "plain_int", .type = AT_OPT_INT, .def = "0", .help = "any int"},
    {.name = "big", .type = AT_OPT_INT, .def = "0", .help = "int64 field", .range = "[-1, inf)", .store = AT_STORE_I64},
    {.name = "kind", .type = AT_OPT_STRING, .def = "lora", .help = "choices", .choices = "lora|qlora|full"},
    {.name = "attn_impl", .type = AT_OPT_STRING, .help = "x", .role = AT_OPT_IGNORED, .note = "always fused"},
    {.name = "deepspeed", .type = AT_OPT_STRING, .help = "x", .role = AT_OPT_REFUSED, .note = "use mpirun -np N"},
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

    /* issue 22.9: a number outside its meaning is refused, the range named;
     * issue 22.10: parsed wide, reported as typed */
    static const struct {
        const char *opt, *val, *want;
    } bad[] = {
        {"--adam_beta1", "1", "--adam_beta1 1: out of range [0, 1)"},
        {"--adam_beta1", "-0.1", "out of range [0, 1)"},
        {"--epochs", "0", "--epochs 0: out of range (0, 1e6]"},
        {"--epochs", "-1", "out of range (0, 1e6]"},
        {"--rank_wide", "2147483648", "--rank_wide 2147483648: out of range [1, 65536]"},
        {"--rank_wide", "0", "out of range [1, 65536]"},
        {"--plain_int", "2147483648", "--plain_int 2147483648: out of range"},
        {"--plain_int", "99999999999999999999", "--plain_int 99999999999999999999: too large"},
        {"--big", "-2", "--big -2: out of range [-1, inf)"},
        {"--kind", "lroa", "use one of lora|qlora|full (did you mean 'lora'?)"},
        {"--deepspeed", "zero2.json", "--deepspeed is not supported: use mpirun -np N"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *av[] = {"sft", bad[i].opt, bad[i].val};
        CHECK_MSG(parse(&o, 3, av) != AT_OK, "%s %s accepted", bad[i].opt, bad[i].val);
        CHECK_MSG(strstr(at_last_error(), bad[i].want) != NULL, "%s %s: %s", bad[i].opt, bad[i].val, at_last_error());
    }
    const char *good[] = {"sft", "--adam_beta1", "0", "--epochs", "1e6", "--rank_wide", "65536", "--big",
                          "9000000000", "--plain_int", "-2147483648", "--kind", "full", "--attn_impl", "sdpa"};
    CHECK_OK(parse(&o, 15, good));
    if (o) {
        struct {
            int64_t big;
        } st = {0};
        at_options_store(o, &st);
        CHECK(st.big == 9000000000LL);
        int k = 0;
        const at_opt_spec *ig = at_options_ignored(o, &k);
        CHECK(ig && !strcmp(ig->name, "attn_impl") && !at_options_ignored(o, &k));
        /* args.json: the ms-swift word set is kept, the unset refused one left out */
        cJSON *j = at_options_to_json(o);
        CHECK(cJSON_GetObjectItem(j, "attn_impl") && !cJSON_GetObjectItem(j, "deepspeed"));
        cJSON_Delete(j);
        at_options_free(o);
    }
    /* a config file's unknown keys, every one at once (issue 21.9) */
    const char *u1[] = {"sft", "--config", "tests/data/config/unknown3.yaml"};
    CHECK_FAILS(parse(&o, 3, u1), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "3 unknown options") && strstr(at_last_error(), "line 2: '--lora_rnak' (did "
              "you mean '--lora_rank'?)") && strstr(at_last_error(), "flash_attn_x") &&
              strstr(at_last_error(), "line 5: '--num_epochs'"), "%s", at_last_error());
    const char *u2[] = {"sft", "--config", "tests/data/config/unknown2.json"};
    CHECK_FAILS(parse(&o, 3, u2), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "2 unknown options") && strstr(at_last_error(), "zzz_unknown"), "%s",
              at_last_error());

    /* the training table (train/train_options.c) is the one source of defaults:
     * the library's are the command line's (issue 22: weight_decay 0 vs 0.1,
     * adam_beta2 0.999 vs 0.95, eval_steps 0 vs 500 before) */
    at_train_args a;
    at_train_args_defaults(&a);
    const char *none[] = {"sft"};
    CHECK_OK(at_options_parse(at_train_options, at_train_n_options, 1, (char **)none, &o));
    if (o) {
        CHECK(a.weight_decay == at_opt_float(o, "weight_decay") && a.weight_decay == 0.1);
        CHECK(a.adam_beta2 == at_opt_float(o, "adam_beta2") && a.adam_beta2 == 0.95);
        CHECK(a.eval_steps == at_opt_int(o, "eval_steps") && a.eval_steps == 500);
        CHECK(a.lora_rank == at_opt_int(o, "lora_rank") && a.learning_rate == at_opt_float(o, "learning_rate"));
        CHECK(a.max_length == 0 && !at_opt_str(o, "max_length")); /* unset: the model's context */
        /* the rows the command line parses from text: the library parses the same defaults */
        at_truncation tr = AT_TRUNCATE_LEFT;
        at_schedule_kind sk = AT_SCHED_LINEAR;
        CHECK_OK(at_truncation_parse(at_opt_str(o, "truncation_strategy"), &tr));
        CHECK_OK(at_schedule_parse(at_opt_str(o, "lr_scheduler_type"), &sk));
        CHECK(a.truncation == tr && a.scheduler == sk);
        CHECK(a.loss_last_turn_only == !strcmp(at_opt_str(o, "loss_scale"), "last_round"));
        at_train_args b;
        memset(&b, 0x55, sizeof b);
        at_options_store_defaults(at_train_options, at_train_n_options, &b);
        at_train_args c2 = b;
        at_options_store(o, &c2); /* parsing nothing stores what the defaults store */
        for (int i = 0; i < at_train_n_options; i++) {
            const at_opt_spec *s = &at_train_options[i];
            if (!s->store) continue;
            const char *pb = (const char *)&b + s->offset, *pc = (const char *)&c2 + s->offset;
            if (s->store == AT_STORE_STR) {
                const char *x, *y;
                memcpy(&x, pb, sizeof x);
                memcpy(&y, pc, sizeof y);
                CHECK_MSG((!x && !y) || (x && y && !strcmp(x, y)), "%s", s->name);
            } else {
                size_t n = s->store == AT_STORE_INT ? sizeof(int) : 8;
                CHECK_MSG(!memcmp(pb, pc, n), "%s", s->name);
            }
        }
        at_options_free(o);
    }
    CHECK_OK(at_train_args_check(&a));
    /* the rlhf rows: the library's defaults (at_pref_config_init, at_grpo_config_init) are the table's, as the
     * command line parses them with nothing given */
    CHECK(at_rlhf_fields_unknown() == 0);
    const char *rl[] = {"rlhf"};
    CHECK_OK(at_options_parse(at_rlhf_options, at_rlhf_n_options, 1, (char **)rl, &o));
    if (o) {
        at_grpo_config g, gc;
        at_grpo_config_init(&g);
        memset(&gc, 0, sizeof gc);
        at_grpo_config_store(o, &gc);
        CHECK(g.num_generations == at_opt_int(o, "num_generations") && g.num_generations == 8);
        CHECK(g.max_completion_length == at_opt_int(o, "max_completion_length") && g.max_completion_length == 512);
        CHECK(g.temperature == at_opt_float(o, "temperature") && g.top_p == at_opt_float(o, "top_p"));
        CHECK(g.epsilon == at_opt_float(o, "epsilon") && g.epsilon_high == 0 && g.num_iterations == 1);
        CHECK(g.max_resample_times == at_opt_int(o, "max_resample_times") && g.max_resample_times == 3);
        CHECK(g.reward_timeout == at_opt_float(o, "reward_timeout") && g.reward_timeout == 60);
        CHECK(g.repetition_n_grams == (double)at_opt_int(o, "repetition_n_grams") &&
              g.repetition_max_penalty == at_opt_float(o, "repetition_max_penalty"));
        CHECK(g.cosine_min_len_value_wrong == at_opt_float(o, "cosine_min_len_value_wrong") &&
              g.cosine_max_len_value_correct == at_opt_float(o, "cosine_max_len_value_correct"));
        at_grpo_scale sc = AT_GRPO_SCALE_NONE;
        CHECK_OK(at_grpo_scale_parse(at_opt_str(o, "scale_rewards"), &sc));
        CHECK(g.scale_rewards == sc && sc == AT_GRPO_SCALE_GROUP);
        CHECK_MSG(!memcmp(&g, &gc, sizeof g), "at_grpo_config_init differs from the parsed defaults");
        at_pref_config pc;
        CHECK_OK(at_pref_config_init(&pc, "kto"));
        CHECK(pc.desirable_weight == at_opt_float(o, "desirable_weight") &&
              pc.undesirable_weight == at_opt_float(o, "undesirable_weight") && pc.desirable_weight == 1);
        CHECK(pc.label_smoothing == at_opt_float(o, "label_smoothing") &&
              pc.center_rewards_coefficient == at_opt_float(o, "center_rewards_coefficient"));
        at_options_free(o);
    }
    /* every stored int row's range fits the int it is stored in; every row's range parses */
    for (int i = 0; i < at_train_n_options; i++) {
        const at_opt_spec *s = &at_train_options[i];
        double lo, hi;
        int lo_open, hi_open;
        if (s->range) CHECK_MSG(at_opt_range(s, &lo, &lo_open, &hi, &hi_open) && lo <= hi, "%s", s->name);
        if (s->store == AT_STORE_INT && s->type == AT_OPT_INT)
            CHECK_MSG(s->range && lo >= INT_MIN && hi <= INT_MAX, "%s: an int field needs an int range", s->name);
        if (s->def) CHECK_MSG(at_opt_check_value(s, s->def, "default") == AT_OK, "%s: %s", s->name, at_last_error());
        if (s->role) CHECK_MSG(s->note && *s->note, "%s: no note", s->name);
    }
    /* the library checks what the command line checks (issue 22.9) */
    static const struct {
        const char *name;
        double v;
    } lib_bad[] = {{"learning_rate", -1e-3}, {"learning_rate", 1e30}, {"adam_beta1", 1}, {"adam_beta2", 2},
                   {"warmup_ratio", 2}, {"num_train_epochs", 0}, {"num_train_epochs", -1}};
    for (size_t i = 0; i < sizeof lib_bad / sizeof lib_bad[0]; i++) {
        at_train_args x = a;
        const at_opt_spec *s = at_opt_find(at_train_options, at_train_n_options, lib_bad[i].name);
        memcpy((char *)&x + s->offset, &lib_bad[i].v, sizeof(double));
        CHECK_MSG(at_train_args_check(&x) != AT_OK && strstr(at_last_error(), lib_bad[i].name), "%s %g accepted",
                  lib_bad[i].name, lib_bad[i].v);
    }
    at_train_args x = a;
    x.warmup_steps = -3;
    CHECK(at_train_args_check(&x) != AT_OK && strstr(at_last_error(), "--warmup_steps -3"));
    x = a;
    x.lora_rank = 0;
    CHECK(at_train_args_check(&x) != AT_OK && strstr(at_last_error(), "--lora_rank 0"));
    /* the command line: the same rows refuse the values */
    static const char *cli_bad[][2] = {{"--learning_rate", "-1e-3"}, {"--adam_beta1", "1"}, {"--adam_beta2", "2"},
                                       {"--learning_rate", "1e30"},  {"--warmup_ratio", "2"}, {"--warmup_steps", "-3"},
                                       {"--num_train_epochs", "0"},  {"--num_train_epochs", "-1"},
                                       {"--lora_rank", "2147483648"}};
    for (size_t i = 0; i < sizeof cli_bad / sizeof cli_bad[0]; i++) {
        const char *av[] = {"sft", cli_bad[i][0], cli_bad[i][1]};
        char want[96];
        snprintf(want, sizeof want, "%s %s: out of range", cli_bad[i][0], cli_bad[i][1]);
        CHECK_MSG(at_options_parse(at_train_options, at_train_n_options, 3, (char **)av, &o) != AT_OK &&
                      strstr(at_last_error(), want), "%s %s: %s", cli_bad[i][0], cli_bad[i][1], at_last_error());
    }
    return at_test_result("test_options");
}
