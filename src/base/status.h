/* Errors as values.
 *
 * Every fallible function returns an at_status. On failure it also records a
 * human-readable message (naming the file, line or tensor concerned) in a
 * thread-local buffer, read with at_last_error(). Library code never exits. */
#ifndef AT_BASE_STATUS_H
#define AT_BASE_STATUS_H

typedef enum {
    AT_OK = 0,
    AT_ERR_INVALID,     /* bad argument or option */
    AT_ERR_IO,          /* open/read/write failed */
    AT_ERR_FORMAT,      /* a file or message does not follow its format */
    AT_ERR_NOMEM,       /* host allocation failed */
    AT_ERR_DEVICE_OOM,  /* device allocation failed */
    AT_ERR_UNSUPPORTED, /* valid but not supported by this build/device */
    AT_ERR_NOT_FOUND,   /* a named thing (tensor, key, device) is absent */
    AT_ERR_DEVICE,      /* a device runtime reported an error */
    AT_ERR_INTERNAL     /* a bug: an invariant did not hold */
} at_status;

/* Records a printf-style message for the calling thread and returns code.
 * Typical use:  return at_error(AT_ERR_FORMAT, "%s: header too short", path); */
at_status at_error(at_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to the current message (adds context while unwinding).
 * Returns code unchanged. */
at_status at_error_wrap(at_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The calling thread's last message ("" when none). Owned by the library;
 * valid until the next at_error on this thread. */
const char *at_last_error(void);

void at_clear_error(void);

/* A fixed short name such as "format error". */
const char *at_status_name(at_status code);

/* Propagate a failing status. */
#define AT_TRY(expr) do { at_status at_try_s_ = (expr); if (at_try_s_ != AT_OK) return at_try_s_; } while (0)
/* Propagate to a cleanup label: requires a local `at_status st` and label `done`. */
#define AT_CHECK(expr) do { st = (expr); if (st != AT_OK) goto done; } while (0)

#endif
