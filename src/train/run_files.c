#include "train/run_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "base/file.h"
#include "base/log.h"
#include "base/sha256.h"

#define MANIFEST "MANIFEST.sha256"

at_status at_run_dir_create(const char *output_dir, char **out)
{
    *out = NULL;
    AT_TRY(at_mkdirs(output_dir));
    DIR *d = opendir(output_dir);
    if (!d) return at_error(AT_ERR_IO, "%s: cannot list: %s", output_dir, strerror(errno));
    long max_n = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end = NULL;
        if (e->d_name[0] != 'v') continue;
        long n = strtol(e->d_name + 1, &end, 10);
        if (end != e->d_name + 1 && *end == '-' && n > max_n) max_n = n;
    }
    closedir(d);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char name[64];
    snprintf(name, sizeof name, "v%ld-%04d%02d%02d-%02d%02d%02d", max_n + 1, tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    char *path = at_path_join(output_dir, name);
    if (!path) return at_error(AT_ERR_NOMEM, "out of memory");
    if (mkdir(path, 0755) != 0) {
        at_status st = at_error(AT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        free(path);
        return st;
    }
    *out = path;
    return AT_OK;
}

at_status at_remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? AT_OK : at_error(AT_ERR_IO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return at_error(AT_ERR_IO, "%s: cannot list: %s", path, strerror(errno));
        struct dirent *e;
        at_status st = AT_OK;
        while (st == AT_OK && (e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *child = at_path_join(path, e->d_name);
            if (!child) {
                st = at_error(AT_ERR_NOMEM, "out of memory");
                break;
            }
            st = at_remove_tree(child);
            free(child);
        }
        closedir(d);
        if (st != AT_OK) return st;
        if (rmdir(path) != 0) return at_error(AT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
        return AT_OK;
    }
    if (unlink(path) != 0) return at_error(AT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return AT_OK;
}

static char *ckpt_name(const char *run_dir, int64_t step, const char *suffix)
{
    char name[64];
    snprintf(name, sizeof name, "checkpoint-%lld%s", (long long)step, suffix);
    return at_path_join(run_dir, name);
}

at_status at_ckpt_begin(const char *run_dir, int64_t step, char **tmp_dir)
{
    *tmp_dir = ckpt_name(run_dir, step, ".tmp");
    if (!*tmp_dir) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = at_remove_tree(*tmp_dir);
    if (st == AT_OK && mkdir(*tmp_dir, 0755) != 0)
        st = at_error(AT_ERR_IO, "%s: cannot create: %s", *tmp_dir, strerror(errno));
    if (st != AT_OK) {
        free(*tmp_dir);
        *tmp_dir = NULL;
    }
    return st;
}

/* Sorted names of the regular files in dir (except the manifest). */
static at_status list_files(const char *dir, char ***names, int *n)
{
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return at_error(AT_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *e;
    int cap = 0;
    at_status st = AT_OK;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, MANIFEST)) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(*names, (size_t)cap * sizeof *nn);
            if (!nn) {
                st = at_error(AT_ERR_NOMEM, "out of memory");
                break;
            }
            *names = nn;
        }
        (*names)[(*n)++] = strdup(e->d_name);
    }
    closedir(d);
    for (int i = 1; i < *n; i++) /* insertion sort: a handful of files */
        for (int j = i; j > 0 && strcmp((*names)[j - 1], (*names)[j]) > 0; j--) {
            char *t = (*names)[j];
            (*names)[j] = (*names)[j - 1];
            (*names)[j - 1] = t;
        }
    return st;
}

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

static at_status fsync_file(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return at_error(AT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r != 0) return at_error(AT_ERR_IO, "%s: fsync failed: %s", path, strerror(e));
    return AT_OK;
}

at_status at_ckpt_commit(const char *run_dir, int64_t step, const char *tmp_dir)
{
    char **names = NULL;
    int n = 0;
    char *manifest = NULL, *final_dir = NULL, *old_dir = NULL;
    size_t cap = 4096, len = 0;
    at_status st = list_files(tmp_dir, &names, &n);
    if (st != AT_OK) goto done;
    manifest = malloc(cap);
    if (!manifest) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    manifest[0] = '\0';
    for (int i = 0; i < n; i++) {
        char *p = at_path_join(tmp_dir, names[i]);
        char hex[65];
        st = p ? fsync_file(p) : at_error(AT_ERR_NOMEM, "out of memory");
        if (st == AT_OK) st = at_sha256_file(p, hex);
        free(p);
        if (st != AT_OK) goto done;
        size_t need = len + 64 + 2 + strlen(names[i]) + 2;
        if (need > cap) {
            while (cap < need) cap *= 2;
            char *nm = realloc(manifest, cap);
            if (!nm) {
                st = at_error(AT_ERR_NOMEM, "out of memory");
                goto done;
            }
            manifest = nm;
        }
        len += (size_t)sprintf(manifest + len, "%s  %s\n", hex, names[i]);
    }
    char *mpath = at_path_join(tmp_dir, MANIFEST);
    st = mpath ? at_write_file_atomic(mpath, manifest, len) : at_error(AT_ERR_NOMEM, "out of memory");
    free(mpath);
    if (st != AT_OK) goto done;
    final_dir = ckpt_name(run_dir, step, "");
    old_dir = ckpt_name(run_dir, step, ".old");
    if (!final_dir || !old_dir) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* An existing checkpoint of the same step is moved aside first, removed after. */
    AT_CHECK(at_remove_tree(old_dir));
    if (at_is_dir(final_dir) && rename(final_dir, old_dir) != 0) {
        st = at_error(AT_ERR_IO, "%s: cannot move aside: %s", final_dir, strerror(errno));
        goto done;
    }
    if (rename(tmp_dir, final_dir) != 0) {
        st = at_error(AT_ERR_IO, "%s: cannot rename to %s: %s", tmp_dir, final_dir, strerror(errno));
        goto done;
    }
    AT_CHECK(at_fsync_dir(run_dir));
    AT_CHECK(at_remove_tree(old_dir));
done:
    free_names(names, n);
    free(manifest);
    free(final_dir);
    free(old_dir);
    return st;
}

at_status at_ckpt_verify(const char *dir)
{
    char *mpath = at_path_join(dir, MANIFEST);
    char *text = NULL;
    char **names = NULL;
    int n = 0, listed = 0;
    at_status st = mpath ? at_read_file(mpath, &text, NULL) : at_error(AT_ERR_NOMEM, "out of memory");
    if (st != AT_OK) {
        st = at_error(AT_ERR_FORMAT, "%s: no readable %s: the checkpoint is incomplete", dir, MANIFEST);
        goto done;
    }
    AT_CHECK(list_files(dir, &names, &n));
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (*line) {
            if (strlen(line) < 67 || line[64] != ' ' || line[65] != ' ') {
                st = at_error(AT_ERR_FORMAT, "%s: malformed line in %s", dir, MANIFEST);
                goto done;
            }
            const char *fname = line + 66;
            char *p = at_path_join(dir, fname);
            char hex[65];
            if (!p || strchr(fname, '/')) {
                free(p);
                st = at_error(AT_ERR_FORMAT, "%s: bad file name in %s", dir, MANIFEST);
                goto done;
            }
            st = at_sha256_file(p, hex);
            free(p);
            if (st != AT_OK) {
                st = at_error(AT_ERR_FORMAT, "%s: %s is listed in the manifest but missing", dir, fname);
                goto done;
            }
            if (strncmp(hex, line, 64) != 0) {
                st = at_error(AT_ERR_FORMAT, "%s: %s does not match its hash in the manifest (damaged)", dir, fname);
                goto done;
            }
            listed++;
        }
        if (!nl) break;
        line = nl + 1;
    }
    if (listed != n) st = at_error(AT_ERR_FORMAT, "%s: holds files that the manifest does not list", dir);
done:
    free(mpath);
    free(text);
    free_names(names, n);
    return st;
}

/* Steps of the sealed checkpoint folders in run_dir, ascending. */
static at_status list_checkpoints(const char *run_dir, int64_t **steps, int *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(run_dir);
    if (!d) return at_error(AT_ERR_IO, "%s: cannot list: %s", run_dir, strerror(errno));
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "checkpoint-", 11) != 0) continue;
        char *end = NULL;
        long long s = strtoll(e->d_name + 11, &end, 10);
        if (end == e->d_name + 11 || *end) continue; /* .tmp and .old are not sealed */
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *ns = realloc(*steps, (size_t)cap * sizeof *ns);
            if (!ns) {
                closedir(d);
                return at_error(AT_ERR_NOMEM, "out of memory");
            }
            *steps = ns;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            int64_t t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return AT_OK;
}

at_status at_ckpt_find_last(const char *run_dir, char **dir, int64_t *step)
{
    *dir = NULL;
    int64_t *steps = NULL;
    int n = 0;
    AT_TRY(list_checkpoints(run_dir, &steps, &n));
    for (int i = n - 1; i >= 0; i--) {
        char *p = ckpt_name(run_dir, steps[i], "");
        if (!p) break;
        if (at_ckpt_verify(p) == AT_OK) {
            *dir = p;
            *step = steps[i];
            free(steps);
            return AT_OK;
        }
        at_log_warn("skipping %s: %s", p, at_last_error());
        free(p);
    }
    free(steps);
    return at_error(AT_ERR_NOT_FOUND, "%s: no complete checkpoint", run_dir);
}

at_status at_ckpt_prune(const char *run_dir, int limit)
{
    int64_t *steps = NULL;
    int n = 0;
    AT_TRY(list_checkpoints(run_dir, &steps, &n));
    at_status st = AT_OK;
    /* Leftovers of interrupted saves. */
    DIR *d = opendir(run_dir);
    if (d) {
        struct dirent *e;
        while (st == AT_OK && (e = readdir(d)) != NULL) {
            size_t l = strlen(e->d_name);
            if (strncmp(e->d_name, "checkpoint-", 11) != 0 || l < 4 || strcmp(e->d_name + l - 4, ".tmp") != 0) continue;
            char *p = at_path_join(run_dir, e->d_name);
            st = p ? at_remove_tree(p) : at_error(AT_ERR_NOMEM, "out of memory");
            free(p);
        }
        closedir(d);
    }
    for (int i = 0; limit > 0 && i < n - limit && st == AT_OK; i++) {
        char *p = ckpt_name(run_dir, steps[i], "");
        st = p ? at_remove_tree(p) : at_error(AT_ERR_NOMEM, "out of memory");
        free(p);
    }
    free(steps);
    return st;
}
