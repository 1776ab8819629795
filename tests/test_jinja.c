/* The Jinja interpreter against Jinja2 itself: tests/data/templates/
 * micro_goldens.json holds small templates and what Debian's python3-jinja2,
 * configured as transformers configures it, rendered for them (made by
 * tools/make_template_goldens.py). Then limits, error positions and
 * {% generation %} spans. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/progress.h"
#include "base/json.h"
#include "testing.h"
#include "text/jinja.h"

#define FIXED_TIME 1721989800 /* 2024-07-26 10:30:00 UTC, as in the goldens */

static at_status render_str(const char *src, const char *vars_json, const at_jinja_options *opt, char **out)
{
    cJSON *vars = NULL;
    if (vars_json) {
        at_status st = at_json_parse(vars_json, strlen(vars_json), "vars", &vars);
        if (st != AT_OK) return st;
    }
    at_jinja_template *t = NULL;
    at_status st = at_jinja_parse(src, strlen(src), "test", &t);
    if (st == AT_OK) st = at_jinja_render(t, vars, opt, out, NULL, NULL, NULL);
    at_jinja_free(t);
    cJSON_Delete(vars);
    return st;
}

static void show_diff(const char *name, const char *want, const char *got)
{
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    fprintf(stderr, "  %s: first difference at byte %zu\n    want: %.80s\n    got:  %.80s\n", name, i,
            want + (i > 20 ? i - 20 : 0), got + (i > 20 ? i - 20 : 0));
}

static void test_micro_goldens(void)
{
    cJSON *cases = NULL;
    CHECK_OK(at_json_parse_file("tests/data/templates/micro_goldens.json", &cases));
    if (!cases) return;
    at_jinja_options opt = {0};
    opt.has_fixed_time = 1;
    opt.fixed_time = FIXED_TIME;
    int n = 0, pass = 0;
    for (cJSON *c = cases->child; c; c = c->next) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const char *src = cJSON_GetObjectItem(c, "template")->valuestring;
        const cJSON *vars = cJSON_GetObjectItem(c, "vars");
        const cJSON *want = cJSON_GetObjectItem(c, "output");
        const cJSON *kind = cJSON_GetObjectItem(c, "error_kind");
        n++;
        at_jinja_template *t = NULL;
        char *out = NULL;
        at_status ps = at_jinja_parse(src, strlen(src), "micro", &t);
        at_status rs = ps == AT_OK ? at_jinja_render(t, vars, &opt, &out, NULL, NULL, NULL) : ps;
        int ok;
        if (want) {
            ok = rs == AT_OK && strcmp(out, want->valuestring) == 0;
            if (!ok) {
                fprintf(stderr, "micro '%s': ", name);
                if (rs != AT_OK)
                    fprintf(stderr, "failed: %s\n", at_last_error());
                else
                    show_diff(name, want->valuestring, out);
            }
        } else {
            int syntax = strcmp(kind->valuestring, "syntax") == 0;
            ok = syntax ? ps == AT_ERR_FORMAT : (ps == AT_OK && rs == AT_ERR_INVALID);
            if (ok && strcmp(kind->valuestring, "raise") == 0)
                ok = strstr(at_last_error(), cJSON_GetObjectItem(c, "error")->valuestring) != NULL;
            if (!ok)
                fprintf(stderr, "micro '%s': expected a %s error (%s), got status %d: %s\n", name, kind->valuestring,
                        cJSON_GetObjectItem(c, "error")->valuestring, rs, rs == AT_OK ? out : at_last_error());
        }
        pass += ok;
        CHECK(ok);
        free(out);
        at_jinja_free(t);
    }
    printf("jinja micro goldens: %d/%d match Jinja2\n", pass, n);
    CHECK(n >= 100);
    cJSON_Delete(cases);
}

static void test_error_positions(void)
{
    char *out = NULL;
    /* a syntax error names line and column */
    CHECK_FAILS(render_str("line one\n{{ a + }}", NULL, NULL, &out), AT_ERR_FORMAT);
    CHECK_MSG(strstr(at_last_error(), "test:2:") != NULL, "got: %s", at_last_error());
    CHECK_FAILS(render_str("{% for x in y %}\n{% endif %}", NULL, NULL, &out), AT_ERR_FORMAT);
    CHECK_MSG(strstr(at_last_error(), "test:2:4") != NULL, "got: %s", at_last_error());
    /* a runtime error too */
    CHECK_FAILS(render_str("ok\n  {{ 1 + none }}", NULL, NULL, &out), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "test:2:") != NULL, "got: %s", at_last_error());
    /* raise_exception carries the template's message */
    CHECK_FAILS(render_str("{{ raise_exception('roles must alternate') }}", NULL, NULL, &out), AT_ERR_INVALID);
    CHECK_MSG(strstr(at_last_error(), "test:1:") && strstr(at_last_error(), "raise_exception: roles must alternate"),
              "got: %s", at_last_error());
    CHECK(out == NULL);
}

static void test_limits(void)
{
    char *out = NULL;
    at_jinja_options opt = {0};
    opt.max_steps = 100000;
    opt.max_output = 1 << 16;
    opt.max_memory = 8 << 20;
    opt.max_depth = 20;
    /* nested loops: 10^15 iterations without the step limit */
    CHECK_FAILS(render_str("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                           "{% endfor %}{% endfor %}{% endfor %}",
                           NULL, &opt, &out),
                AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "steps") != NULL);
    /* an empty sequence repeated a billion times is empty, and quick (a fuzz find) */
    double t0 = at_now_seconds();
    CHECK_OK(render_str("{{ ([] * 1000000000) | length }}{{ '' * 1000000000 }}x", NULL, &opt, &out));
    CHECK(out && !strcmp(out, "0x"));
    CHECK(at_now_seconds() - t0 < 1.0);
    free(out);
    out = NULL;
    /* unbounded recursion */
    CHECK_FAILS(render_str("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &opt, &out), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "nested") != NULL);
    /* output size */
    CHECK_FAILS(render_str("{% for a in range(10000) %}0123456789{% endfor %}", NULL, &opt, &out), AT_ERR_INVALID);
    CHECK(strstr(at_last_error(), "output") != NULL);
    /* doubling a string grows memory exponentially */
    CHECK_FAILS(render_str("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
                           "{% endfor %}{{ ns.s | length }}",
                           NULL, &opt, &out),
                AT_ERR_INVALID);
    CHECK_FAILS(render_str("{{ 'x' * 100000000000 }}", NULL, &opt, &out), AT_ERR_INVALID);
    CHECK_FAILS(render_str("{{ range(1000000000) | length }}", NULL, &opt, &out), AT_ERR_INVALID);
    /* deep nesting in the source */
    char deep[4000];
    size_t k = 0;
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k] = '\0';
    char src[4100];
    snprintf(src, sizeof src, "{{ %s1 }}", deep);
    CHECK_FAILS(render_str(src, NULL, &opt, &out), AT_ERR_FORMAT);
    CHECK(out == NULL);
    /* within limits it works */
    CHECK_OK(render_str("{% for a in range(100) %}{{ a % 10 }}{% endfor %}", NULL, &opt, &out));
    CHECK(out && strlen(out) == 100);
    free(out);
}

static void test_generation_spans(void)
{
    const char *src = "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}"
                      "{{ m.content }}</s>{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}";
    cJSON *vars = NULL;
    const char *vj = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"},"
                     "{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"zz\"}]}";
    CHECK_OK(at_json_parse(vj, strlen(vj), "vars", &vars));
    at_jinja_template *t = NULL;
    CHECK_OK(at_jinja_parse(src, strlen(src), "gen", &t));
    CHECK(at_jinja_has_generation(t));
    char *out = NULL;
    size_t len = 0, ng = 0;
    at_jinja_span *g = NULL;
    CHECK_OK(at_jinja_render(t, vars, NULL, &out, &len, &g, &ng));
    CHECK(out && strcmp(out, "<user>hi<assistant>yo</s><user>x<assistant>zz</s>") == 0);
    CHECK(ng == 2);
    if (ng == 2 && out) {
        CHECK(strncmp(out + g[0].start, "yo</s>", g[0].end - g[0].start) == 0 && g[0].end - g[0].start == 6);
        CHECK(strncmp(out + g[1].start, "zz</s>", g[1].end - g[1].start) == 0 && g[1].end == len);
    }
    free(g);
    free(out);
    at_jinja_free(t);
    cJSON_Delete(vars);
}

static void test_strftime(void)
{
    at_jinja_options opt = {0};
    opt.has_fixed_time = 1;
    opt.fixed_time = FIXED_TIME;
    char *out = NULL;
    CHECK_OK(render_str("{{ strftime_now('%d %B %Y') }}", NULL, &opt, &out));
    CHECK(out && strcmp(out, "26 July 2024") == 0);
    free(out);
    /* without a fixed time: today's date, some non-empty text */
    out = NULL;
    CHECK_OK(render_str("{{ strftime_now('%Y') }}", NULL, NULL, &out));
    CHECK(out && strlen(out) == 4);
    free(out);
}

int main(void)
{
    test_micro_goldens();
    test_error_positions();
    test_limits();
    test_generation_spans();
    test_strftime();
    return at_test_result("test_jinja");
}
