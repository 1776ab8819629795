#include "base/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"

static void line_col(const char *text, size_t off, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

/* text[0..len) as one JSON value, or NULL; then *bad is the offset where
 * it went wrong and *trailing says whether a whole value came before it.
 * Anything but whitespace after the value is an error, as in strict parsers. */
static cJSON *parse_strict(const char *text, size_t len, size_t *bad, int *trailing)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    *trailing = j != NULL;
    *bad = (end && end >= text && end <= text + len) ? (size_t)(end - text) : 0;
    if (j && end) {
        while (*bad < len && (text[*bad] == ' ' || text[*bad] == '\n' || text[*bad] == '\r' || text[*bad] == '\t'))
            (*bad)++;
        if (*bad < len && text[*bad] != '\0') {
            cJSON_Delete(j);
            return NULL;
        }
    }
    return j;
}

at_status at_json_parse(const char *text, size_t len, const char *what, cJSON **out)
{
    size_t bad;
    int trailing, line, col;
    *out = parse_strict(text, len, &bad, &trailing);
    if (*out) return AT_OK;
    line_col(text, bad, &line, &col);
    return at_error(AT_ERR_FORMAT, "%s: %s at line %d, column %d", what,
                    trailing ? "unexpected data after JSON value" : "malformed JSON", line, col);
}

cJSON *at_json_value(const char *text)
{
    size_t bad;
    int trailing;
    return text ? parse_strict(text, strlen(text), &bad, &trailing) : NULL;
}

at_status at_json_parse_file(const char *path, cJSON **out)
{
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    AT_TRY(at_read_file(path, &text, &len));
    at_status st = at_json_parse(text, len, path, out);
    free(text);
    return st;
}

at_status at_json_get_int(const cJSON *obj, const char *key, const char *what, long long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return AT_ERR_NOT_FOUND;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 9.0e15)
        return at_error(AT_ERR_FORMAT, "%s: \"%s\" must be an integer", what, key);
    *out = (long long)v->valuedouble;
    return AT_OK;
}

at_status at_json_get_double(const cJSON *obj, const char *key, const char *what, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return AT_ERR_NOT_FOUND;
    if (!cJSON_IsNumber(v)) return at_error(AT_ERR_FORMAT, "%s: \"%s\" must be a number", what, key);
    *out = v->valuedouble;
    return AT_OK;
}

at_status at_json_get_bool(const cJSON *obj, const char *key, const char *what, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return AT_ERR_NOT_FOUND;
    if (!cJSON_IsBool(v)) return at_error(AT_ERR_FORMAT, "%s: \"%s\" must be true or false", what, key);
    *out = cJSON_IsTrue(v);
    return AT_OK;
}

at_status at_json_get_string(const cJSON *obj, const char *key, const char *what, const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return AT_ERR_NOT_FOUND;
    if (!cJSON_IsString(v)) return at_error(AT_ERR_FORMAT, "%s: \"%s\" must be a string", what, key);
    *out = v->valuestring;
    return AT_OK;
}
