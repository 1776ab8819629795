/* Staging folder, manifest and atomic rename of an export (export_files.h). */
#include "export/export_files.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/manifest.h"
#include "base/file.h"
#include "base/log.h"
#include "train/run_files.h"

/* OUT with its trailing slashes removed (so "out/" and "out" stage alike). */
static char *clean_path(const char *p)
{
    char *s = strdup(p);
    if (!s) return NULL;
    size_t n = strlen(s);
    while (n > 1 && s[n - 1] == '/') s[--n] = '\0';
    return s;
}

static char *suffixed(const char *base, const char *what)
{
    size_t n = strlen(base) + 64;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s.%s-%ld", base, what, (long)getpid());
    return s;
}

/* Removes OUT.tmp-PID and OUT.old-PID folders of exports whose process is
 * gone (killed before it could clean up); those of live processes stay. */
static void remove_stale(const char *out)
{
    const char *slash = strrchr(out, '/');
    char *parent = slash ? strndup(out, slash == out ? 1 : (size_t)(slash - out)) : strdup(".");
    const char *base = slash ? slash + 1 : out;
    size_t bl = strlen(base);
    DIR *d = parent ? opendir(parent) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, base, bl) != 0 || n[bl] != '.') continue;
        const char *rest = n + bl + 1;
        if (strncmp(rest, "tmp-", 4) != 0 && strncmp(rest, "old-", 4) != 0) continue;
        char *end = NULL;
        long pid = strtol(rest + 4, &end, 10);
        if (end == rest + 4 || *end || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to ask): keep */
        char *p = at_path_join(parent, n);
        if (p && at_remove_tree(p) == AT_OK) at_log_info("export: removed %s, left by an export that was killed", p);
        free(p);
    }
    if (d) closedir(d);
    free(parent);
}

at_status at_export_begin(const char *out_dir, int overwrite, char **staging)
{
    *staging = NULL;
    if (!out_dir || !out_dir[0]) return at_error(AT_ERR_INVALID, "export: no output folder given (--output_dir)");
    char *out = clean_path(out_dir);
    if (!out) return at_error(AT_ERR_NOMEM, "export: out of memory");
    at_status st = AT_OK;
    struct stat sb;
    if (lstat(out, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) {
            st = at_error(AT_ERR_INVALID, "export: %s exists and is not a folder", out);
            goto done;
        }
        if (!overwrite) {
            st = at_error(AT_ERR_INVALID, "export: %s already exists (pass --overwrite to replace it)", out);
            goto done;
        }
    }
    char *slash = strrchr(out, '/');
    if (slash && slash != out) {
        *slash = '\0';
        st = at_mkdirs(out);
        *slash = '/';
        if (st != AT_OK) goto done;
    }
    remove_stale(out);
    char *tmp = suffixed(out, "tmp");
    if (!tmp) {
        st = at_error(AT_ERR_NOMEM, "export: out of memory");
        goto done;
    }
    if (at_file_exists(tmp)) (void)at_remove_tree(tmp); /* a leftover of a crashed run with our pid */
    if (mkdir(tmp, 0755) != 0) {
        st = at_error(AT_ERR_IO, "export: cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        goto done;
    }
    *staging = tmp;
done:
    free(out);
    return st;
}

at_status at_export_commit(const char *staging, const char *out_dir)
{
    char *out = clean_path(out_dir), *old = NULL, *parent = NULL;
    at_status st = AT_OK;
    if (!out) return at_error(AT_ERR_NOMEM, "export: out of memory");
    AT_CHECK(at_manifest_write(staging));
    AT_CHECK(at_fsync_dir(staging));
    if (at_file_exists(out)) {
        /* Overwriting: move the old one aside so OUT is never half old, half new. */
        if (!(old = suffixed(out, "old"))) {
            st = at_error(AT_ERR_NOMEM, "export: out of memory");
            goto done;
        }
        if (rename(out, old) != 0) {
            st = at_error(AT_ERR_IO, "export: cannot move %s aside: %s", out, strerror(errno));
            goto done;
        }
    }
    if (rename(staging, out) != 0) {
        st = at_error(AT_ERR_IO, "export: cannot rename %s to %s: %s", staging, out, strerror(errno));
        if (old) (void)rename(old, out);
        goto done;
    }
    if (old) (void)at_remove_tree(old);
    parent = strdup(out);
    if (parent) {
        char *slash = strrchr(parent, '/');
        if (slash) {
            if (slash == parent) slash[1] = '\0';
            else *slash = '\0';
            st = at_fsync_dir(parent);
        } else {
            st = at_fsync_dir(".");
        }
    }
done:
    free(out);
    free(old);
    free(parent);
    return st;
}

void at_export_abort(const char *staging)
{
    if (!staging) return;
    char keep[512];
    snprintf(keep, sizeof keep, "%s", at_last_error());
    (void)at_remove_tree(staging);
    if (keep[0]) at_error(AT_ERR_IO, "%s", keep); /* the cause, not the cleanup, is what the user needs */
}

at_status at_export_copy_file(const char *src, const char *dst)
{
    char *data = NULL;
    size_t len = 0;
    AT_TRY(at_read_file(src, &data, &len));
    at_status st = at_write_file_atomic(dst, data, len);
    free(data);
    return st;
}

at_status at_export_parse_size(const char *s, int64_t *out)
{
    if (!s || !*s) return at_error(AT_ERR_INVALID, "size: empty");
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0)) return at_error(AT_ERR_INVALID, "size \"%s\": not a positive number", s);
    while (*end == ' ') end++;
    char unit[8] = {0};
    for (int i = 0; end[i] && i < 7; i++) unit[i] = (char)toupper((unsigned char)end[i]);
    if (strlen(end) > 7) return at_error(AT_ERR_INVALID, "size \"%s\": unknown unit", s);
    double m;
    if (!unit[0] || !strcmp(unit, "B")) m = 1;
    else if (!strcmp(unit, "KB")) m = 1e3;
    else if (!strcmp(unit, "MB")) m = 1e6;
    else if (!strcmp(unit, "GB")) m = 1e9;
    else if (!strcmp(unit, "TB")) m = 1e12;
    else if (!strcmp(unit, "KIB")) m = 1024.0;
    else if (!strcmp(unit, "MIB")) m = 1024.0 * 1024;
    else if (!strcmp(unit, "GIB")) m = 1024.0 * 1024 * 1024;
    else if (!strcmp(unit, "TIB")) m = 1024.0 * 1024 * 1024 * 1024;
    else return at_error(AT_ERR_INVALID, "size \"%s\": unknown unit \"%s\" (B, KB, MB, GB, KiB, MiB, GiB)", s, end);
    v *= m;
    if (v < 1 || v > 9e18) return at_error(AT_ERR_INVALID, "size \"%s\" is out of range", s);
    *out = (int64_t)v;
    return AT_OK;
}
