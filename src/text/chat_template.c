/* Chat templates: loading (model folders, tokenizer_config.json, built-in
 * fallbacks) and rendering with the variables transformers passes. */
#include "text/chat_template.h"

#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/json.h"
#include "text/chat_template_internal.h"

struct at_chat_template {
    at_jinja_template *t;
    char *source;
    cJSON *tokens; /* object: special token name -> string (or list of strings) */
};

/* ---- built-in fallbacks ----
 * The same texts are in tests/data/templates/builtin/NAME.jinja, which the
 * goldens are made from; test_chat_template checks they are identical. */

#define CHATML_SRC                                                                                                  \
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}" \
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"                                        \
    "{% endif %}"

/* Llama 2 chat (the template of Llama-2-7b-chat-hf, without its default system prompt). */
#define LLAMA2_SRC                                                                                                  \
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"                                 \
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"                  \
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"                                  \
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"                                                 \
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"                  \
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"                                               \
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"                  \
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"                  \
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"           \
    "{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"

/* Llama 3 instruct (the original Meta-Llama-3-8B-Instruct template). */
#define LLAMA3_SRC                                                                                                  \
    "{% set loop_messages = messages %}{% for message in loop_messages %}"                                           \
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n"                               \
    "\n"                                                                                                             \
    "'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"                                        \
    "{% set content = bos_token + content %}{% endif %}{{ content }}"                                                \
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n"                  \
    "\n"                                                                                                             \
    "' }}{% endif %}"

/* Mistral instruct (as Mistral-7B-Instruct-v0.2, system message folded into the first turn). */
#define MISTRAL_SRC                                                                                                 \
    "{%- if messages[0]['role'] == 'system' %}\n"                                                                    \
    "    {%- set system_message = messages[0]['content'] %}\n"                                                       \
    "    {%- set loop_messages = messages[1:] %}\n"                                                                  \
    "{%- else %}\n"                                                                                                  \
    "    {%- set loop_messages = messages %}\n"                                                                      \
    "{%- endif %}\n"                                                                                                 \
    "\n"                                                                                                             \
    "{{- bos_token }}\n"                                                                                             \
    "{%- for message in loop_messages %}\n"                                                                          \
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"                                            \
    "\n"                                                                                                             \
    "        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}" \
    "\n"                                                                                                             \
    "    {%- endif %}\n"                                                                                             \
    "    {%- if message['role'] == 'user' %}\n"                                                                      \
    "        {%- if loop.first and system_message is defined %}\n"                                                  \
    "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}"                    \
    "\n"                                                                                                             \
    "        {%- else %}\n"                                                                                          \
    "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}"                                                \
    "\n"                                                                                                             \
    "        {%- endif %}\n"                                                                                         \
    "    {%- elif message['role'] == 'assistant' %}\n"                                                               \
    "        {{- ' ' + message['content'] + eos_token }}\n"                                                          \
    "    {%- else %}\n"                                                                                              \
    "        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}" \
    "\n"                                                                                                             \
    "    {%- endif %}\n"                                                                                             \
    "{%- endfor %}\n"

/* ms-swift's templates that add a default system message to a conversation
 * without one (their TemplateMeta.default_system): the family's template
 * behind a line that puts it first, as Qwen2.5's own template does. */
#define WITH_DEFAULT_SYSTEM(text)                                                                                   \
    "{%- if not messages or messages[0]['role'] != 'system' %}{%- set messages = [{\"role\": \"system\", "          \
    "\"content\": \"" text "\"}] + messages %}{%- endif %}"

/* swift/llm/template/template/utils.py DEFAULT_SYSTEM (template qwen) */
#define SWIFT_DEFAULT_SYSTEM "You are a helpful assistant."
/* qwen.py Qwen2_5TemplateMeta (the text Qwen2.5's own template adds) */
#define QWEN2_5_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
/* llama.py LLAMA_DEFAULT_SYSTEM (template llama: Llama 2 chat's published default) */
#define LLAMA2_SYSTEM                                                                                               \
    "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, while being "      \
    "safe. Your answers should not include any harmful, unethical, racist, sexist, toxic, dangerous, or illegal "    \
    "content. Please ensure that your responses are socially unbiased and positive in nature.\\n\\nIf a question "   \
    "does not make any sense, or is not factually coherent, explain why instead of answering something not "        \
    "correct. If you don't know the answer to a question, please don't share false information."
/* internlm.py INTERNLM_SYSTEM (template internlm2) */
#define INTERNLM_SYSTEM                                                                                             \
    "You are an AI assistant whose name is InternLM (书生·浦语).\\n- InternLM (书生·浦语) is a conversational "      \
    "language model that is developed by Shanghai AI Laboratory (上海人工智能实验室). It is designed to be "        \
    "helpful, honest, and harmless.\\n- InternLM (书生·浦语) can understand and communicate fluently in the "       \
    "language chosen by the user such as English and 中文."

/* ms-swift's llama3_2 (Llama 3.2's own rule): a system turn always, the
 * knowledge cutoff and today's date, then the system message if any. */
#define LLAMA3_2_SRC                                                                                                \
    "{{- bos_token }}{%- if messages and messages[0]['role'] == 'system' %}"                                        \
    "{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"                   \
    "{%- else %}{%- set system_message = '' %}{%- endif %}\n"                                                        \
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\nToday Date: ' + " \
    "strftime_now('%d %b %Y') + '\\n\\n' + system_message + '<|eot_id|>' }}\n"                                       \
    "{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "      \
    "message['content'] | trim + '<|eot_id|>' }}{%- endfor %}\n"                                                     \
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"

static const struct {
    const char *name;
    const char *src;
    const char *bos, *eos;
} builtins[] = {
    {"chatml", CHATML_SRC, NULL, "<|im_end|>"},
    {"llama-2", LLAMA2_SRC, "<s>", "</s>"},
    {"llama-3", LLAMA3_SRC, "<|begin_of_text|>", "<|eot_id|>"},
    {"mistral", MISTRAL_SRC, "<s>", "</s>"},
    /* ms-swift's template names whose text differs from ours: a default system message, a date */
    {"qwen", WITH_DEFAULT_SYSTEM(SWIFT_DEFAULT_SYSTEM) CHATML_SRC, NULL, "<|im_end|>"},
    {"qwen2_5", WITH_DEFAULT_SYSTEM(QWEN2_5_SYSTEM) CHATML_SRC, NULL, "<|im_end|>"},
    {"internlm2", WITH_DEFAULT_SYSTEM(INTERNLM_SYSTEM) CHATML_SRC, NULL, "<|im_end|>"},
    {"llama", WITH_DEFAULT_SYSTEM(LLAMA2_SYSTEM) LLAMA2_SRC, "<s>", "</s>"},
    {"llama3_2", LLAMA3_2_SRC, "<|begin_of_text|>", "<|eot_id|>"},
};

/* ms-swift's template (or model type) names for the built-ins whose text they
 * render as they are: no default system message (ms-swift's chatml, yi's
 * chatml, llama3). qwen2 models use ms-swift's template qwen. */
static const struct {
    const char *alias, *name;
} aliases[] = {
    {"qwen2", "qwen"},        {"yi", "chatml"},       {"llama2", "llama"},    {"llama3", "llama-3"},
    {"llama3_1", "llama-3"},  {"llama3_3", "llama-3"},
};

const char *at_chat_template_builtin_name(const char *name)
{
    for (size_t i = 0; name && i < sizeof builtins / sizeof builtins[0]; i++)
        if (!strcmp(builtins[i].name, name)) return builtins[i].name;
    for (size_t i = 0; name && i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(aliases[i].alias, name)) return aliases[i].name;
    return NULL;
}

const char *at_chat_template_builtin_source(const char *name)
{
    name = at_chat_template_builtin_name(name);
    for (size_t i = 0; name && i < sizeof builtins / sizeof builtins[0]; i++)
        if (!strcmp(builtins[i].name, name)) return builtins[i].src;
    return NULL;
}

void at_chat_template_free(at_chat_template *ct)
{
    if (!ct) return;
    at_jinja_free(ct->t);
    free(ct->source);
    cJSON_Delete(ct->tokens);
    free(ct);
}

const char *at_chat_template_source(const at_chat_template *ct) { return ct ? ct->source : NULL; }

const char *at_chat_template_token(const at_chat_template *ct, const char *key)
{
    if (!ct || !ct->tokens) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(ct->tokens, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static at_status make(const char *src, size_t len, const char *name, const cJSON *tokens, at_chat_template **out)
{
    *out = NULL;
    at_chat_template *ct = calloc(1, sizeof *ct);
    if (!ct) return at_error(AT_ERR_NOMEM, "%s: out of memory", name);
    at_status st = AT_OK;
    ct->source = malloc(len + 1);
    ct->tokens = tokens ? cJSON_Duplicate(tokens, 1) : cJSON_CreateObject();
    if (!ct->source || !ct->tokens) {
        st = at_error(AT_ERR_NOMEM, "%s: out of memory", name);
        goto done;
    }
    memcpy(ct->source, src, len);
    ct->source[len] = '\0';
    AT_CHECK(at_jinja_parse(src, len, name, &ct->t));
    *out = ct;
    ct = NULL;
done:
    at_chat_template_free(ct);
    return st;
}

at_status at_chat_template_from_string(const char *src, size_t len, const char *name, const cJSON *tokens,
                                       at_chat_template **out)
{
    if (tokens && !cJSON_IsObject(tokens)) return at_error(AT_ERR_INVALID, "%s: special tokens must be an object", name);
    return make(src, len, name ? name : "chat_template", tokens, out);
}

at_status at_chat_template_builtin(const char *name, const cJSON *tokens, at_chat_template **out)
{
    *out = NULL;
    const char *given = name;
    name = at_chat_template_builtin_name(name);
    for (size_t i = 0; name && i < sizeof builtins / sizeof builtins[0]; i++) {
        if (strcmp(builtins[i].name, name) != 0) continue;
        if (tokens) return at_chat_template_from_string(builtins[i].src, strlen(builtins[i].src), name, tokens, out);
        cJSON *tk = cJSON_CreateObject();
        if (!tk) return at_error(AT_ERR_NOMEM, "out of memory");
        if (builtins[i].bos) cJSON_AddStringToObject(tk, "bos_token", builtins[i].bos);
        if (builtins[i].eos) cJSON_AddStringToObject(tk, "eos_token", builtins[i].eos);
        at_status st = make(builtins[i].src, strlen(builtins[i].src), name, tk, out);
        cJSON_Delete(tk);
        return st;
    }
    return at_error(AT_ERR_NOT_FOUND, "no built-in chat template named '%s' (have %s)", given ? given : "(null)",
                    AT_CHAT_TEMPLATE_NAMES);
}

/* A token given as a string or as an AddedToken object {"content": ...}. */
static const char *token_text(const cJSON *v)
{
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

/* transformers' special_tokens_map from a tokenizer config. */
static at_status config_tokens(const cJSON *cfg, const char *path, cJSON **out)
{
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
    cJSON *tk = cJSON_CreateObject();
    if (!tk) return at_error(AT_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[i]);
        if (!v || cJSON_IsNull(v)) continue;
        const char *s = token_text(v);
        if (!s) {
            cJSON_Delete(tk);
            return at_error(AT_ERR_FORMAT, "%s: \"%s\" must be a string or an AddedToken object", path, keys[i]);
        }
        cJSON_AddStringToObject(tk, keys[i], s);
    }
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(cfg, "additional_special_tokens");
    if (cJSON_IsArray(extra) && cJSON_GetArraySize(extra) > 0) {
        cJSON *arr = cJSON_AddArrayToObject(tk, "additional_special_tokens");
        for (const cJSON *e = extra ? extra->child : NULL; e && arr; e = e->next) {
            const char *s = token_text(e);
            if (s) cJSON_AddItemToArray(arr, cJSON_CreateString(s));
        }
    }
    *out = tk;
    return AT_OK;
}

/* The template text named `which` in a config's chat_template field. */
static at_status config_template(const cJSON *cfg, const char *path, const char *which, const char **src)
{
    const cJSON *ctf = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *want = which ? which : "default";
    if (!ctf || cJSON_IsNull(ctf)) return at_error(AT_ERR_NOT_FOUND, "%s: no chat_template", path);
    if (cJSON_IsString(ctf)) {
        if (which && strcmp(which, "default") != 0)
            return at_error(AT_ERR_NOT_FOUND, "%s: has a single chat template, not one named '%s'", path, which);
        *src = ctf->valuestring;
        return AT_OK;
    }
    if (!cJSON_IsArray(ctf))
        return at_error(AT_ERR_FORMAT, "%s: chat_template must be a string or a list of {name, template}", path);
    for (const cJSON *e = ctf->child; e; e = e->next) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (!cJSON_IsString(nm) || !cJSON_IsString(tp))
            return at_error(AT_ERR_FORMAT, "%s: chat_template list entries need string \"name\" and \"template\"", path);
        if (!strcmp(nm->valuestring, want)) {
            *src = tp->valuestring;
            return AT_OK;
        }
    }
    return at_error(AT_ERR_NOT_FOUND, "%s: no chat template named '%s'", path, want);
}

at_status at_chat_template_from_config(const char *path, const char *which, at_chat_template **out)
{
    *out = NULL;
    cJSON *cfg = NULL, *tokens = NULL;
    at_status st = AT_OK;
    const char *src = NULL;
    AT_CHECK(at_json_parse_file(path, &cfg));
    if (!cJSON_IsObject(cfg)) {
        st = at_error(AT_ERR_FORMAT, "%s: not a JSON object", path);
        goto done;
    }
    AT_CHECK(config_template(cfg, path, which, &src));
    AT_CHECK(config_tokens(cfg, path, &tokens));
    AT_CHECK(make(src, strlen(src), path, tokens, out));
done:
    cJSON_Delete(cfg);
    cJSON_Delete(tokens);
    return st;
}

at_status at_chat_template_load(const char *dir, const char *which, const char *fallback, at_chat_template **out)
{
    *out = NULL;
    at_status st = AT_OK;
    cJSON *cfg = NULL, *tokens = NULL;
    char *text = NULL;
    char *cfg_path = at_path_join(dir, "tokenizer_config.json");
    char *jinja_path = at_path_join(dir, "chat_template.jinja");
    if (!cfg_path || !jinja_path) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (at_file_exists(cfg_path)) {
        AT_CHECK(at_json_parse_file(cfg_path, &cfg));
        if (!cJSON_IsObject(cfg)) {
            st = at_error(AT_ERR_FORMAT, "%s: not a JSON object", cfg_path);
            goto done;
        }
        AT_CHECK(config_tokens(cfg, cfg_path, &tokens));
    }
    if (at_file_exists(jinja_path) && (!which || !strcmp(which, "default"))) {
        size_t len = 0;
        AT_CHECK(at_read_file(jinja_path, &text, &len));
        st = make(text, len, jinja_path, tokens, out);
        goto done;
    }
    if (cfg) {
        const char *src = NULL;
        st = config_template(cfg, cfg_path, which, &src);
        if (st == AT_OK) {
            st = make(src, strlen(src), cfg_path, tokens, out);
            goto done;
        }
        if (st != AT_ERR_NOT_FOUND || !fallback) goto done;
    }
    if (!fallback) {
        st = at_error(AT_ERR_NOT_FOUND, "%s: no chat template (no chat_template.jinja, no chat_template in "
                                        "tokenizer_config.json) and no fallback given", dir);
        goto done;
    }
    if (tokens && cJSON_GetObjectItemCaseSensitive(tokens, "eos_token"))
        st = at_chat_template_builtin(fallback, tokens, out);
    else
        st = at_chat_template_builtin(fallback, NULL, out);
done:
    free(text);
    free(cfg_path);
    free(jinja_path);
    cJSON_Delete(cfg);
    cJSON_Delete(tokens);
    return st;
}

/* ---- rendering ---- */

/* The variables object for messages[0..n). Items are references into the
 * caller's JSON (no copies). Caller deletes. */
static at_status build_vars(const at_chat_template *ct, const cJSON *messages, int n, const at_chat_render_opts *opt,
                            int agp, cJSON **out)
{
    cJSON *v = cJSON_CreateObject(), *msgs = cJSON_CreateArray();
    if (!v || !msgs) goto oom;
    for (const cJSON *t = ct->tokens ? ct->tokens->child : NULL; t; t = t->next)
        if (!cJSON_AddItemReferenceToObject(v, t->string, (cJSON *)t)) goto oom;
    if (opt->extra) {
        for (const cJSON *e = opt->extra->child; e; e = e->next) {
            cJSON_DeleteItemFromObjectCaseSensitive(v, e->string);
            if (!cJSON_AddItemReferenceToObject(v, e->string, (cJSON *)e)) goto oom;
        }
    }
    int i = 0;
    for (const cJSON *m = messages->child; m && i < n; m = m->next, i++)
        if (!cJSON_AddItemReferenceToArray(msgs, (cJSON *)m)) goto oom;
    static const char *const fixed[] = {"messages", "tools", "documents", "add_generation_prompt"};
    for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++) cJSON_DeleteItemFromObjectCaseSensitive(v, fixed[k]);
    cJSON_AddItemToObject(v, "messages", msgs);
    msgs = NULL;
    if (opt->tools) {
        if (!cJSON_AddItemReferenceToObject(v, "tools", (cJSON *)opt->tools)) goto oom;
    } else if (!cJSON_AddNullToObject(v, "tools")) {
        goto oom;
    }
    if (!cJSON_AddNullToObject(v, "documents") || !cJSON_AddBoolToObject(v, "add_generation_prompt", agp)) goto oom;
    *out = v;
    return AT_OK;
oom:
    cJSON_Delete(v);
    cJSON_Delete(msgs);
    return at_error(AT_ERR_NOMEM, "out of memory building template variables");
}

at_status at_chat_render_prefix(const at_chat_template *ct, const cJSON *messages, int n,
                                const at_chat_render_opts *opt, int agp, char **text, size_t *len)
{
    cJSON *vars = NULL;
    AT_TRY(build_vars(ct, messages, n, opt, agp, &vars));
    at_status st = at_jinja_render(ct->t, vars, opt->jinja, text, len, NULL, NULL);
    cJSON_Delete(vars);
    return st;
}

static at_status check_messages(const cJSON *messages)
{
    if (!cJSON_IsArray(messages)) return at_error(AT_ERR_INVALID, "messages must be a JSON array");
    int i = 0;
    for (const cJSON *m = messages->child; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) return at_error(AT_ERR_INVALID, "messages[%d] must be an object", i);
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")))
            return at_error(AT_ERR_INVALID, "messages[%d] needs a string \"role\"", i);
    }
    return AT_OK;
}

at_status at_chat_template_render(const at_chat_template *ct, const cJSON *messages, const at_chat_render_opts *opt,
                                  at_chat_rendered *out)
{
    memset(out, 0, sizeof *out);
    at_chat_render_opts dflt = {0};
    if (!opt) opt = &dflt;
    if (!ct) return at_error(AT_ERR_INVALID, "no chat template");
    AT_TRY(check_messages(messages));
    if (opt->tools && !cJSON_IsArray(opt->tools)) return at_error(AT_ERR_INVALID, "tools must be a JSON array");
    if (opt->extra && !cJSON_IsObject(opt->extra)) return at_error(AT_ERR_INVALID, "extra variables must be a JSON object");
    at_status st = at_chat_render_prefix(ct, messages, cJSON_GetArraySize(messages), opt, opt->add_generation_prompt,
                                         &out->text, &out->len);
    if (st != AT_OK) return st;
    if (opt->mask != AT_CHAT_MASK_NONE) {
        st = at_chat_find_spans(ct, messages, opt, out->text, out->len, &out->spans, &out->n_spans);
        if (st != AT_OK) at_chat_rendered_free(out);
    }
    return st;
}

void at_chat_rendered_free(at_chat_rendered *r)
{
    if (!r) return;
    free(r->text);
    free(r->spans);
    memset(r, 0, sizeof *r);
}
