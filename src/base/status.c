#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define AT_ERRMSG_MAX 2048

static _Thread_local char errmsg[AT_ERRMSG_MAX];

at_status at_error(at_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return code;
}

at_status at_error_wrap(at_status code, const char *fmt, ...)
{
    char prefix[512];
    char old[AT_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errmsg, sizeof old);
    size_t pl = strlen(prefix);
    if (pl > AT_ERRMSG_MAX - 3) pl = AT_ERRMSG_MAX - 3;
    memcpy(errmsg, prefix, pl);
    errmsg[pl] = ':';
    errmsg[pl + 1] = ' ';
    size_t room = AT_ERRMSG_MAX - pl - 3, ol = strlen(old);
    if (ol > room) ol = room;
    memcpy(errmsg + pl + 2, old, ol);
    errmsg[pl + 2 + ol] = '\0';
    return code;
}

const char *at_last_error(void) { return errmsg; }

void at_clear_error(void) { errmsg[0] = '\0'; }

const char *at_status_name(at_status code)
{
    switch (code) {
    case AT_OK: return "ok";
    case AT_ERR_INVALID: return "invalid argument";
    case AT_ERR_IO: return "i/o error";
    case AT_ERR_FORMAT: return "format error";
    case AT_ERR_NOMEM: return "out of memory";
    case AT_ERR_DEVICE_OOM: return "out of device memory";
    case AT_ERR_UNSUPPORTED: return "unsupported";
    case AT_ERR_NOT_FOUND: return "not found";
    case AT_ERR_DEVICE: return "device error";
    case AT_ERR_INTERNAL: return "internal error";
    }
    return "unknown error";
}
