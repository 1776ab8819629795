/* Qwen2-VL / Qwen2.5-VL / Qwen3-VL: the vision config, the tower's tensor names and
 * shapes, the loader's check of the tower's weights, and M-RoPE
 * position ids against tools/make_mrope_goldens.py (get_rope_index). */
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "model/decoder.h"
#include "model/loader.h"
#include "model/mrope.h"
#include "model/safetensors.h"
#include "model/vision_config.h"
#include "testing.h"

static at_status parse(const char *json, at_vision_config *vc) {
    cJSON *root = NULL;
    at_status st = at_json_parse(json, strlen(json), "config.json", &root);
    if (st == AT_OK) st = at_vision_config_from_json(root, "config.json", vc);
    cJSON_Delete(root);
    return st;
}

/* The vision parts of the published Qwen2-VL-2B-Instruct and
 * Qwen2.5-VL-3B-Instruct config.json files. */
static const char *qwen2_vl_2b =
    "{\"model_type\": \"qwen2_vl\", \"hidden_size\": 1536, \"image_token_id\": 151655, \"video_token_id\": 151656,"
    " \"vision_start_token_id\": 151652, \"vision_end_token_id\": 151653,"
    " \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [16, 24, 24]},"
    " \"vision_config\": {\"depth\": 32, \"embed_dim\": 1280, \"mlp_ratio\": 4, \"num_heads\": 16, \"in_chans\": 3,"
    " \"hidden_size\": 1536, \"patch_size\": 14, \"spatial_merge_size\": 2, \"temporal_patch_size\": 2}}";
static const char *qwen2_5_vl_3b =
    "{\"model_type\": \"qwen2_5_vl\", \"hidden_size\": 2048, \"image_token_id\": 151655,"
    " \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [16, 24, 24]},"
    " \"vision_config\": {\"depth\": 32, \"hidden_act\": \"silu\", \"hidden_size\": 1280, \"intermediate_size\": 3420,"
    " \"num_heads\": 16, \"in_chans\": 3, \"out_hidden_size\": 2048, \"patch_size\": 14, \"spatial_merge_size\": 2,"
    " \"spatial_patch_size\": 14, \"window_size\": 112, \"fullatt_block_indexes\": [7, 15, 23, 31],"
    " \"tokens_per_second\": 2, \"temporal_patch_size\": 2}}";

/* Laid out as Qwen3-VL-2B-Instruct's: text_config, the vision side's own key names. */
static const char *qwen3_vl_2b =
    "{\"model_type\": \"qwen3_vl\", \"image_token_id\": 151655, \"video_token_id\": 151656,"
    " \"vision_start_token_id\": 151652, \"vision_end_token_id\": 151653, \"tie_word_embeddings\": true,"
    " \"text_config\": {\"model_type\": \"qwen3_vl_text\", \"hidden_size\": 2048, \"head_dim\": 128,"
    " \"rope_scaling\": {\"mrope_interleaved\": true, \"mrope_section\": [24, 20, 20], \"rope_type\": \"default\"}},"
    " \"vision_config\": {\"deepstack_visual_indexes\": [5, 11, 17], \"depth\": 24, \"hidden_act\": \"gelu_pytorch_tanh\","
    " \"hidden_size\": 1024, \"in_channels\": 3, \"intermediate_size\": 4096, \"model_type\": \"qwen3_vl\","
    " \"num_heads\": 16, \"num_position_embeddings\": 2304, \"out_hidden_size\": 2048, \"patch_size\": 16,"
    " \"spatial_merge_size\": 2, \"temporal_patch_size\": 2}}";

static const at_vision_tensor *find(const at_vision_tensor *t, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

static void test_published_configs(void) {
    at_vision_config vc;
    CHECK_OK(parse(qwen2_vl_2b, &vc));
    CHECK(vc.kind == AT_VISION_QWEN2_VL && vc.depth == 32 && vc.width == 1280 && vc.intermediate_size == 5120);
    CHECK(vc.out_hidden_size == 1536 && vc.num_heads == 16 && !strcmp(vc.hidden_act, "quick_gelu"));
    CHECK(vc.mrope_section[0] == 16 && vc.mrope_section[2] == 24 && vc.image_token_id == 151655);
    at_vision_tensor *t = NULL;
    size_t n = 0;
    CHECK_OK(at_vision_tensors(&vc, &t, &n));
    /* patch embed + 32 blocks of 12 + ln_q weight and bias + 2 linear layers */
    CHECK(n == 1 + 32 * 12 + 2 + 4);
    const at_vision_tensor *x = find(t, n, "visual.patch_embed.proj.weight");
    CHECK(x && x->ndim == 5 && x->shape[0] == 1280 && x->shape[1] == 3 && x->shape[2] == 2 && x->shape[4] == 14);
    x = find(t, n, "visual.merger.mlp.0.weight");
    CHECK(x && x->shape[0] == 5120 && x->shape[1] == 5120);
    x = find(t, n, "visual.merger.mlp.2.weight");
    CHECK(x && x->shape[0] == 1536 && x->shape[1] == 5120);
    x = find(t, n, "visual.blocks.31.mlp.fc2.weight");
    CHECK(x && x->shape[0] == 1280 && x->shape[1] == 5120);
    CHECK(find(t, n, "visual.blocks.0.norm1.bias") != NULL);
    free(t);

    CHECK_OK(parse(qwen2_5_vl_3b, &vc));
    CHECK(vc.kind == AT_VISION_QWEN2_5_VL && vc.width == 1280 && vc.intermediate_size == 3420 &&
          vc.out_hidden_size == 2048 && vc.window_size == 112 && vc.n_fullatt == 4 && vc.fullatt_block_indexes[3] == 31);
    CHECK(vc.vision_start_token_id == 151652); /* transformers' default when the file does not say */
    CHECK_OK(at_vision_tensors(&vc, &t, &n));
    CHECK(n == 1 + 32 * 12 + 1 + 4); /* RMSNorms: no biases */
    x = find(t, n, "visual.blocks.3.mlp.gate_proj.weight");
    CHECK(x && x->shape[0] == 3420 && x->shape[1] == 1280);
    CHECK(find(t, n, "visual.blocks.0.norm1.bias") == NULL && find(t, n, "visual.merger.ln_q.bias") == NULL);
    free(t);

    CHECK_OK(parse(qwen3_vl_2b, &vc));
    CHECK(vc.kind == AT_VISION_QWEN3_VL && vc.width == 1024 && vc.intermediate_size == 4096 &&
          vc.out_hidden_size == 2048 && vc.patch_size == 16 && vc.num_position_embeddings == 2304);
    CHECK(vc.n_deepstack == 3 && vc.deepstack_visual_indexes[2] == 17 && vc.mrope_section[0] == 24 &&
          !strcmp(vc.hidden_act, "gelu_pytorch_tanh"));
    CHECK_OK(at_vision_tensors(&vc, &t, &n));
    /* patch embedding (weight, bias), positions, 24 blocks of 12, the merger and 3 deepstack mergers of 6 */
    CHECK(n == 3 + 24 * 12 + 4 * 6);
    x = find(t, n, "visual.pos_embed.weight");
    CHECK(x && x->ndim == 2 && x->shape[0] == 2304 && x->shape[1] == 1024);
    x = find(t, n, "visual.merger.norm.weight");
    CHECK(x && x->shape[0] == 1024);
    x = find(t, n, "visual.deepstack_merger_list.2.norm.weight"); /* after the 2x2 merge */
    CHECK(x && x->shape[0] == 4096);
    x = find(t, n, "visual.deepstack_merger_list.0.linear_fc2.weight");
    CHECK(x && x->shape[0] == 2048 && x->shape[1] == 4096);
    x = find(t, n, "visual.blocks.23.mlp.linear_fc1.weight");
    CHECK(x && x->shape[0] == 4096 && x->shape[1] == 1024);
    free(t);
}

static void test_bad_configs(void) {
    static const struct {
        const char *json, *word;
    } cases[] = {
        {"{\"model_type\": \"qwen2_vl\", \"rope_scaling\": {\"mrope_section\": [1, 1, 1]}, \"vision_config\": "
         "{\"embed_dim\": 16, \"num_heads\": 2, \"hidden_size\": 8}}", "depth"},
        {"{\"model_type\": \"qwen2_vl\", \"vision_config\": {\"depth\": 1, \"embed_dim\": 16, \"num_heads\": 2, "
         "\"hidden_size\": 8}}", "mrope_section"},
        {"{\"model_type\": \"qwen2_vl\", \"rope_scaling\": {\"mrope_section\": [1, 1, 1]}, \"vision_config\": "
         "{\"depth\": 1, \"embed_dim\": 16, \"num_heads\": 2, \"hidden_size\": 8, \"mlp_ratio\": 4.5}}", "mlp_ratio"},
        {"{\"model_type\": \"qwen2_vl\", \"rope_scaling\": {\"mrope_section\": [1, 1, 1]}, \"vision_config\": "
         "{\"depth\": 1, \"embed_dim\": 18, \"num_heads\": 4, \"hidden_size\": 8}}", "even head size"},
        {"{\"model_type\": \"qwen2_5_vl\", \"rope_scaling\": {\"mrope_section\": [1, 1, 1]}, \"vision_config\": "
         "{\"depth\": 2, \"hidden_size\": 16, \"intermediate_size\": 8, \"out_hidden_size\": 8, \"num_heads\": 2, "
         "\"fullatt_block_indexes\": [2]}}", "fullatt_block_indexes"},
        {"{\"model_type\": \"llava\", \"vision_config\": {}}", "not supported"},
#define Q3 "{\"model_type\": \"qwen3_vl\", \"text_config\": {\"rope_scaling\": {\"mrope_section\": [1, 1, 1]}}, " \
           "\"vision_config\": {\"depth\": 2, \"hidden_size\": 16, \"intermediate_size\": 8, \"out_hidden_size\": 8, " \
           "\"num_heads\": 2, "
        {Q3 "\"num_position_embeddings\": 20, \"deepstack_visual_indexes\": [0]}}", "not a square"},
        {Q3 "\"num_position_embeddings\": 16, \"deepstack_visual_indexes\": [2]}}", "deepstack_visual_indexes[0]"},
        {Q3 "\"num_position_embeddings\": 16, \"deepstack_visual_indexes\": [1, 0]}}", "deepstack_visual_indexes[1]"},
        {Q3 "\"num_position_embeddings\": 16}}", "deepstack_visual_indexes[0]"}, /* transformers' default 8, 16, 24 */
        {Q3 "\"deepstack_visual_indexes\": [], \"hidden_act\": \"silu\"}}", "gelu_pytorch_tanh"},
#undef Q3
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        at_vision_config vc;
        at_status st = parse(cases[i].json, &vc);
        CHECK_MSG(st != AT_OK && strstr(at_last_error(), cases[i].word) && strstr(at_last_error(), "config.json"),
                  "case %zu: %s: %s", i, at_status_name(st), at_last_error());
    }
}

static void test_tiny_folders(void) {
    static const char *dirs[] = {"tests/data/models/tiny-qwen2-vl", "tests/data/models/tiny-qwen2_5-vl"};
    for (int k = 0; k < 2; k++) {
        char path[128];
        snprintf(path, sizeof path, "%s/config.json", dirs[k]);
        cJSON *root = NULL;
        CHECK_OK(at_json_parse_file(path, &root));
        at_vision_config vc;
        CHECK_OK(at_vision_config_from_json(root, path, &vc));
        cJSON_Delete(root);
        at_st_model *m = NULL;
        CHECK_OK(at_st_model_open(dirs[k], &m));
        if (!m) continue;
        CHECK_OK(at_vision_check_weights(&vc, m, dirs[k]));
        at_vision_config wrong = vc;
        wrong.width = 32; /* every shape disagrees: the first tensor is named */
        CHECK_FAILS(at_vision_check_weights(&wrong, m, dirs[k]), AT_ERR_FORMAT);
        CHECK(strstr(at_last_error(), "visual.patch_embed.proj.weight has shape [16, 3, 2, 14, 14]") != NULL);
        wrong = vc;
        wrong.depth = 3;
        CHECK_FAILS(at_vision_check_weights(&wrong, m, dirs[k]), AT_ERR_NOT_FOUND);
        CHECK(strstr(at_last_error(), "visual.blocks.2.norm1.weight") != NULL);
        at_st_model_close(m);
        /* the loader checks the tower, then wants the language model, which
         * these folders (tower only) lack: the message names it */
        at_decoder *d = NULL;
        CHECK_FAILS(at_decoder_load(dirs[k], NULL, &d), AT_ERR_NOT_FOUND);
        CHECK(d == NULL);
        CHECK_MSG(strstr(at_last_error(), "model.embed_tokens.weight"), "%s", at_last_error());
        /* and a tower tensor missing is named before anything else */
        CHECK_FAILS(at_vision_gate(dirs[k], "tests/data/goldens/llama_gqa/model.safetensors"), AT_ERR_NOT_FOUND);
        CHECK_MSG(strstr(at_last_error(), "visual.patch_embed.proj.weight"), "%s", at_last_error());
    }
}

static void test_mrope_goldens(void) {
    cJSON *g = NULL;
    CHECK_OK(at_json_parse_file("tests/data/models/mrope_goldens.json", &g));
    if (!g) return;
    at_mrope_tokens tk = {151655, 151656, 151652, 2};
    const cJSON *c;
    int n_cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        const cJSON *ids_j = cJSON_GetObjectItem(c, "ids"), *grids_j = cJSON_GetObjectItem(c, "grid_thw");
        const cJSON *pos_j = cJSON_GetObjectItem(c, "position_ids");
        size_t n = (size_t)cJSON_GetArraySize(ids_j), ni = (size_t)cJSON_GetArraySize(grids_j);
        int32_t *ids = malloc(n * sizeof *ids), *pos = malloc(3 * n * sizeof *pos), (*grids)[3] = malloc((ni + 1) * sizeof *grids);
        if (!ids || !pos || !grids) break;
        for (size_t i = 0; i < n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(ids_j, (int)i)->valuedouble;
        for (size_t i = 0; i < ni; i++)
            for (int d = 0; d < 3; d++)
                grids[i][d] = (int32_t)cJSON_GetArrayItem(cJSON_GetArrayItem(grids_j, (int)i), d)->valuedouble;
        int64_t delta = 0;
        CHECK_OK(at_mrope_position_ids(&tk, ids, n, (const int32_t(*)[3])grids, ni, pos, &delta));
        size_t bad = 0;
        for (int d = 0; d < 3; d++)
            for (size_t i = 0; i < n; i++)
                bad += pos[d * n + i] != (int32_t)cJSON_GetArrayItem(cJSON_GetArrayItem(pos_j, d), (int)i)->valuedouble;
        CHECK_MSG(bad == 0, "case %d: %zu position ids differ", n_cases, bad);
        CHECK_MSG(delta == (int64_t)cJSON_GetObjectItem(c, "delta")->valuedouble, "case %d: delta %lld", n_cases,
                  (long long)delta);
        if (ni > 0) {
            /* one grid too few, and a grid whose tokens outnumber the run */
            CHECK_FAILS(at_mrope_position_ids(&tk, ids, n, (const int32_t(*)[3])grids, ni - 1, pos, NULL),
                        AT_ERR_INVALID);
            grids[0][1] *= 2;
            CHECK_FAILS(at_mrope_position_ids(&tk, ids, n, (const int32_t(*)[3])grids, ni, pos, NULL), AT_ERR_INVALID);
            grids[0][1] /= 2;
            /* a video after <|vision_start|> is refused */
            for (size_t i = 0; i + 1 < n; i++)
                if (ids[i] == tk.vision_start_token_id) {
                    ids[i + 1] = tk.video_token_id;
                    break;
                }
            CHECK_FAILS(at_mrope_position_ids(&tk, ids, n, (const int32_t(*)[3])grids, ni, pos, NULL),
                        AT_ERR_UNSUPPORTED);
        }
        free(ids);
        free(pos);
        free(grids);
        n_cases++;
    }
    CHECK(n_cases == 6);
    cJSON_Delete(g);
}

int main(void) {
    test_published_configs();
    test_bad_configs();
    test_tiny_folders();
    test_mrope_goldens();
    return at_test_result("vision_config");
}
