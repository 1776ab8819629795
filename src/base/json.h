/* JSON through cJSON, with errors that name the file and the line. */
#ifndef AT_BASE_JSON_H
#define AT_BASE_JSON_H

#include <stddef.h>
#include <cjson/cJSON.h>
#include "base/status.h"

/* Parses text[0..len) (need not be NUL-terminated). On failure the message
 * names `what` (a file name or "request body") and the line and column.
 * *out is owned by the caller (cJSON_Delete). */
at_status at_json_parse(const char *text, size_t len, const char *what, cJSON **out);

/* NUL-terminated text parsed as strictly as at_json_parse (nothing but
 * whitespace after the value), or NULL when it is not one JSON value; sets
 * no message, for callers that report the failure in their own words.
 * Owned by the caller (cJSON_Delete). */
cJSON *at_json_value(const char *text);

/* Reads and parses a file. */
at_status at_json_parse_file(const char *path, cJSON **out);

/* Typed getters: return AT_OK and set *out when `key` exists with that type;
 * AT_ERR_NOT_FOUND when absent (no message set); AT_ERR_FORMAT with a message
 * naming `what` and the key when present with the wrong type. */
at_status at_json_get_int(const cJSON *obj, const char *key, const char *what, long long *out);
at_status at_json_get_double(const cJSON *obj, const char *key, const char *what, double *out);
at_status at_json_get_bool(const cJSON *obj, const char *key, const char *what, int *out);
/* *out points into obj (not a copy). */
at_status at_json_get_string(const cJSON *obj, const char *key, const char *what, const char **out);

#endif
