/* Logging with levels. The level comes from ANYTUNE_LOG
 * (error|warn|info|debug; default info), read once. Messages go to stderr. */
#ifndef AT_BASE_LOG_H
#define AT_BASE_LOG_H

typedef enum { AT_LOG_ERROR = 0, AT_LOG_WARN, AT_LOG_INFO, AT_LOG_DEBUG } at_log_level;

void at_log(at_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int at_log_enabled(at_log_level level);
/* Overrides the environment (tests, --quiet). */
void at_log_set_level(at_log_level level);

#define at_log_debug(...) at_log(AT_LOG_DEBUG, __VA_ARGS__)
#define at_log_info(...) at_log(AT_LOG_INFO, __VA_ARGS__)
#define at_log_warn(...) at_log(AT_LOG_WARN, __VA_ARGS__)
#define at_log_error(...) at_log(AT_LOG_ERROR, __VA_ARGS__)

#endif
