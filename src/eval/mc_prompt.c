#include "eval/mc_prompt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const en_system = "The following are multiple choice questions (with answers) about %s.\n\n";
static const char *const zh_system = "以下是中国关于%s考试的单项选择题，请选出其中的正确答案。\n\n";

at_status at_mc_lang_parse(const char *s, at_mc_lang *out)
{
    if (s && !strcmp(s, "en")) *out = AT_MC_EN;
    else if (s && !strcmp(s, "zh")) *out = AT_MC_ZH;
    else return at_error(AT_ERR_INVALID, "--lang %s: use en or zh", s ? s : "(none)");
    return AT_OK;
}

const char *at_mc_lang_name(at_mc_lang l)
{
    return l == AT_MC_ZH ? "zh" : "en";
}

char *at_mc_format_question(const at_mc_item *it, at_mc_lang lang)
{
    const char *cue = lang == AT_MC_ZH ? "\n答案：" : "\nAnswer:";
    size_t n = strlen(it->question) + strlen(cue) + 1;
    for (int k = 0; k < AT_MC_CHOICES; k++) n += strlen(it->choices[k]) + 4;
    char *s = malloc(n), *p = s;
    if (!s) return NULL;
    p += sprintf(p, "%s", it->question);
    for (int k = 0; k < AT_MC_CHOICES; k++) p += sprintf(p, "\n%c. %s", 'A' + k, it->choices[k]);
    sprintf(p, "%s", cue);
    return s;
}

static int add_message(cJSON *arr, const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    if (!m) return 0;
    cJSON_AddItemToArray(arr, m);
    return cJSON_AddStringToObject(m, "role", role) && cJSON_AddStringToObject(m, "content", content);
}

at_status at_mc_messages(const at_mc_item *q, const at_mc_item *shots, size_t n_shots, const char *subject,
                         at_mc_lang lang, cJSON **out)
{
    *out = NULL;
    cJSON *arr = cJSON_CreateArray();
    char *sys = NULL, *text = NULL;
    at_status st = AT_OK;
    const char *fmt = lang == AT_MC_ZH ? zh_system : en_system;
    size_t sn = strlen(fmt) + strlen(subject) + 1;
    if (!arr || !(sys = malloc(sn))) goto oom;
    snprintf(sys, sn, fmt, subject);
    for (size_t i = 0; i <= n_shots; i++) {
        const at_mc_item *it = i < n_shots ? &shots[i] : q;
        char *ex = at_mc_format_question(it, lang);
        if (!ex) goto oom;
        if (i == 0) {
            /* the system line goes in front of the first user turn */
            text = malloc(strlen(sys) + strlen(ex) + 1);
            if (!text) {
                free(ex);
                goto oom;
            }
            strcpy(text, sys);
            strcat(text, ex);
            free(ex);
            ex = text;
            text = NULL;
        }
        int ok = add_message(arr, "user", ex);
        free(ex);
        if (!ok) goto oom;
        if (i < n_shots) {
            char letter[2] = {(char)('A' + it->answer), 0};
            if (!add_message(arr, "assistant", letter)) goto oom;
        }
    }
    free(sys);
    *out = arr;
    return st;
oom:
    free(sys);
    cJSON_Delete(arr);
    return at_error(AT_ERR_NOMEM, "out of memory");
}

at_status at_mc_prompt_text(const at_chat_template *tmpl, const cJSON *messages, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    if (tmpl) {
        at_chat_render_opts ro = {0};
        ro.add_generation_prompt = 1;
        at_chat_rendered r = {0};
        AT_TRY(at_chat_template_render(tmpl, messages, &ro, &r));
        *text = r.text;
        *len = r.len;
        r.text = NULL;
        at_chat_rendered_free(&r);
        return AT_OK;
    }
    /* LLaMA-Factory's "fewshot" template: contents as they are, "\n\n"
     * before every user turn but the first, no end-of-turn tokens */
    size_t n = 1;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) n += strlen(cJSON_GetObjectItem(m, "content")->valuestring) + 2;
    char *s = malloc(n);
    if (!s) return at_error(AT_ERR_NOMEM, "out of memory");
    size_t k = 0;
    int i = 0;
    cJSON_ArrayForEach(m, messages) {
        const char *role = cJSON_GetObjectItem(m, "role")->valuestring;
        const char *c = cJSON_GetObjectItem(m, "content")->valuestring;
        if (i++ > 0 && !strcmp(role, "user")) {
            memcpy(s + k, "\n\n", 2);
            k += 2;
        }
        size_t cl = strlen(c);
        memcpy(s + k, c, cl);
        k += cl;
    }
    s[k] = 0;
    *text = s;
    *len = k;
    return AT_OK;
}
