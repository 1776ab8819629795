/* Fuzz target: arbitrary bytes as a chat template, parsed and rendered
 * against a small fixed conversation (with tools and a tool call), then
 * rendered again computing loss-mask spans. Tight limits make hostile
 * templates (endless loops, deep recursion, exponential strings) end with an
 * error instead of hanging or exhausting memory. Seeds: tests/fuzz/jinja/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "text/chat_template.h"
#include "text/jinja.h"

static const char CONVERSATION[] =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Weather in Paris? \\u00e9\\u4f60\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call12345\", \"type\": \"function\","
    "   \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"content\": \"21\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nok\\n</think>\\n\\nIt is 21 C.\"},"
    " {\"role\": \"user\", \"content\": \"Thanks\"},"
    " {\"role\": \"assistant\", \"content\": \"You're welcome.\"}]";
static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cJSON *messages, *tools, *tokens;
    if (!messages) {
        messages = cJSON_Parse(CONVERSATION);
        tools = cJSON_Parse(TOOLS);
        tokens = cJSON_Parse("{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}");
        if (!messages || !tools || !tokens) abort();
    }
    if (size > 1 << 16) return 0;
    at_jinja_options jo = {0};
    jo.max_output = 1 << 20;
    jo.max_memory = 64 << 20;
    jo.max_steps = 200000;
    jo.max_depth = 16;
    jo.has_fixed_time = 1;
    jo.fixed_time = 1721989800;

    at_chat_template *ct = NULL;
    if (at_chat_template_from_string((const char *)data, size, "fuzz", tokens, &ct) != AT_OK) return 0;
    at_chat_render_opts o = {0};
    o.jinja = &jo;
    o.tools = (size & 1) ? tools : NULL;
    o.add_generation_prompt = (size & 2) != 0;
    at_chat_rendered r;
    if (at_chat_template_render(ct, messages, &o, &r) == AT_OK) {
        if (r.len != strlen(r.text)) {
            /* output may hold NUL bytes only if the template printed them */
        }
        at_chat_rendered_free(&r);
        o.add_generation_prompt = 0;
        o.mask = (size & 4) ? AT_CHAT_MASK_LAST : AT_CHAT_MASK_ALL;
        if (at_chat_template_render(ct, messages, &o, &r) == AT_OK) {
            for (size_t i = 0; i < r.n_spans; i++)
                if (r.spans[i].start >= r.spans[i].end || r.spans[i].end > r.len) abort();
            at_chat_rendered_free(&r);
        }
    }
    at_chat_template_free(ct);
    return 0;
}
