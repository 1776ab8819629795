#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int current_level = -1;

static int level_from_env(void)
{
    const char *s = getenv("ANYTUNE_LOG");
    if (!s || !*s) return AT_LOG_INFO;
    if (!strcmp(s, "error")) return AT_LOG_ERROR;
    if (!strcmp(s, "warn") || !strcmp(s, "warning")) return AT_LOG_WARN;
    if (!strcmp(s, "debug") || !strcmp(s, "trace")) return AT_LOG_DEBUG;
    return AT_LOG_INFO;
}

void at_log_set_level(at_log_level level) { current_level = (int)level; }

int at_log_enabled(at_log_level level)
{
    if (current_level < 0) current_level = level_from_env();
    return (int)level <= current_level;
}

void at_log(at_log_level level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warning", "info", "debug"};
    if (!at_log_enabled(level)) return;
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "anytune: %s: %s\n", names[level], buf);
}
