#include "train/run_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "base/manifest.h"

at_status at_run_dir_create(const char *output_dir, char **out)
{
    *out = NULL;
    if (!output_dir || !output_dir[0])
        return at_error(AT_ERR_INVALID, "--output_dir is empty: give the folder where runs go (default: output)");
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

at_status at_ckpt_commit(const char *run_dir, int64_t step, const char *tmp_dir)
{
    char *final_dir = NULL, *old_dir = NULL;
    at_status st = at_manifest_write(tmp_dir);
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
    free(final_dir);
    free(old_dir);
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
        if (at_manifest_verify(p) == AT_OK) {
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

/* The eval_loss logged at `step` in RUN/logging.jsonl (the last line of
 * that step that has one), or NaN. lines/n: the file's (step, eval_loss)
 * pairs, read once by the caller. */
static double eval_at(const double (*pairs)[2], int n, int64_t step)
{
    double v = NAN;
    for (int i = 0; i < n; i++)
        if (pairs[i][0] == (double)step) v = pairs[i][1];
    return v;
}

/* Every (step, eval_loss) of RUN/logging.jsonl; none when there is no log. */
static at_status read_evals(const char *run_dir, double (**pairs)[2], int *n)
{
    *pairs = NULL;
    *n = 0;
    char *path = at_path_join(run_dir, "logging.jsonl"), *text = NULL;
    size_t len = 0;
    if (!path) return at_error(AT_ERR_NOMEM, "out of memory");
    int exists = at_file_exists(path);
    at_status st = exists ? at_read_file(path, &text, &len) : AT_OK;
    free(path);
    int cap = 0;
    for (char *line = text; st == AT_OK && text && line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        size_t l = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
        cJSON *j = cJSON_ParseWithLength(line, l);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step"), *e = cJSON_GetObjectItemCaseSensitive(j, "eval_loss");
        if (cJSON_IsNumber(s) && cJSON_IsNumber(e)) {
            if (*n == cap) {
                cap = cap ? cap * 2 : 16;
                double(*np)[2] = realloc(*pairs, (size_t)cap * sizeof *np);
                if (!np) st = at_error(AT_ERR_NOMEM, "out of memory");
                else *pairs = np;
            }
            if (st == AT_OK) {
                (*pairs)[*n][0] = s->valuedouble;
                (*pairs)[(*n)++][1] = e->valuedouble;
            }
        }
        cJSON_Delete(j);
        line += l + 1;
    }
    free(text);
    if (st != AT_OK) {
        free(*pairs);
        *pairs = NULL;
        *n = 0;
    }
    return st;
}

/* The best of the sealed checkpoints steps[0..n): the lowest eval_loss
 * logged at its step (the earliest of equals, as transformers keeps the
 * first best); -1 when none was evaluated. */
static int best_index(const int64_t *steps, int n, const double (*pairs)[2], int np, double *value)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        double v = eval_at(pairs, np, steps[i]);
        if (isfinite(v) && (best < 0 || v < *value)) {
            best = i;
            *value = v;
        }
    }
    return best;
}

at_status at_run_best_checkpoint(const char *run_dir, int64_t *step, double *value)
{
    int64_t *steps = NULL;
    int n = 0, np = 0;
    double(*pairs)[2] = NULL;
    AT_TRY(list_checkpoints(run_dir, &steps, &n));
    at_status st = read_evals(run_dir, &pairs, &np);
    int b = st == AT_OK ? best_index(steps, n, (const double(*)[2])pairs, np, value) : -1;
    if (st == AT_OK && b < 0) st = at_error(AT_ERR_NOT_FOUND, "%s: no checkpoint was evaluated", run_dir);
    if (b >= 0) *step = steps[b];
    free(steps);
    free(pairs);
    return st;
}

at_status at_ckpt_prune(const char *run_dir, int limit, int keep_best)
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
    /* transformers' _rotate_checkpoints with load_best_model_at_end: the best
     * is never deleted; it counts among the `limit` kept, except that limit 1
     * keeps the newest beside it */
    int best = -1;
    if (keep_best && st == AT_OK && limit > 0 && n > limit) {
        double(*pairs)[2] = NULL, v = 0;
        int np = 0;
        st = read_evals(run_dir, &pairs, &np);
        if (st == AT_OK) best = best_index(steps, n, (const double(*)[2])pairs, np, &v);
        free(pairs);
    }
    int drop = limit > 0 && n > limit ? n - limit : 0; /* the oldest `drop` go */
    if (best >= 0 && best < drop) drop = limit > 1 ? drop + 1 : drop;
    for (int i = 0; i < drop && st == AT_OK; i++) {
        if (i == best) continue;
        char *p = ckpt_name(run_dir, steps[i], "");
        st = p ? at_remove_tree(p) : at_error(AT_ERR_NOMEM, "out of memory");
        free(p);
    }
    free(steps);
    return st;
}

#define LOCK_NAME ".anytune.lock"

/* The pid a lock file names, or 0. */
static long lock_holder(int fd)
{
    char buf[32] = {0};
    ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
    return r > 0 ? strtol(buf, NULL, 10) : 0;
}

at_status at_run_lock_take(const char *run_dir, at_run_lock *lk)
{
    lk->fd = -1;
    lk->path = at_path_join(run_dir, LOCK_NAME);
    if (!lk->path) return at_error(AT_ERR_NOMEM, "out of memory");
    /* The file a lock is taken on must still be the one at the path: a
     * releasing holder unlinks it, and a lock on the unlinked file would
     * not exclude the next writer. */
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(lk->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) {
            at_status st = at_error(AT_ERR_IO, "%s: cannot open: %s", lk->path, strerror(errno));
            free(lk->path);
            lk->path = NULL;
            return st;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            long pid = lock_holder(fd);
            close(fd);
            at_status st = e == EWOULDBLOCK
                               ? at_error(AT_ERR_INVALID, "%s is in use by another anytune (pid %ld) writing this "
                                          "run; wait for it to end or stop it first", run_dir, pid)
                               : at_error(AT_ERR_IO, "%s: cannot lock: %s", lk->path, strerror(e));
            free(lk->path);
            lk->path = NULL;
            return st;
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(lk->path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
            char pid[32];
            int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
                /* the pid is only for the message of a refused writer: the lock holds without it */
            }
            lk->fd = fd;
            return AT_OK;
        }
        close(fd); /* unlinked under us by a releasing holder: take the new file */
    }
    at_status st = at_error(AT_ERR_IO, "%s: cannot lock (the file keeps being replaced)", lk->path);
    free(lk->path);
    lk->path = NULL;
    return st;
}

void at_run_lock_release(at_run_lock *lk)
{
    if (lk->fd >= 0 && lk->path) { /* path NULL: a zeroed lock never taken (fd 0 is not ours) */
        unlink(lk->path); /* before the unlock: a waiter then finds the new file (see above) */
        close(lk->fd);
    }
    lk->fd = -1;
    free(lk->path);
    lk->path = NULL;
}

/* The parent folder of a checkpoint folder (trailing '/' ignored); a new string. */
static char *parent_of(const char *dir)
{
    char *p = strdup(dir);
    if (!p) return NULL;
    size_t l = strlen(p);
    while (l > 1 && p[l - 1] == '/') p[--l] = '\0';
    char *slash = strrchr(p, '/');
    if (!slash) strcpy(p, ".");
    else if (slash == p) slash[1] = '\0';
    else *slash = '\0';
    return p;
}

at_status at_run_find_resume(const char *output_dir, const char *spec, int versioned, char **run_dir, char **ckpt,
                             int64_t *step)
{
    *run_dir = NULL;
    *ckpt = NULL;
    *step = 0;
    if (!strcmp(spec, "last") && !versioned) {
        *run_dir = strdup(output_dir);
        if (!*run_dir) return at_error(AT_ERR_NOMEM, "out of memory");
        at_status st = at_ckpt_find_last(*run_dir, ckpt, step);
        if (st != AT_OK) {
            free(*run_dir);
            *run_dir = NULL;
        }
        return st;
    }
    if (strcmp(spec, "last") != 0) {
        if (!at_is_dir(spec))
            return at_error(AT_ERR_NOT_FOUND, "--resume_from_checkpoint %s: no such checkpoint folder (give a "
                            "RUN/checkpoint-N folder, or 'last' for the newest run under --output_dir)", spec);
        AT_TRY(at_manifest_verify(spec));
        *ckpt = strdup(spec);
        if (!*ckpt) return at_error(AT_ERR_NOMEM, "out of memory");
        size_t l = strlen(*ckpt);
        while (l > 1 && (*ckpt)[l - 1] == '/') (*ckpt)[--l] = '\0';
        const char *base = strrchr(*ckpt, '/');
        base = base ? base + 1 : *ckpt;
        char *end = NULL;
        long long s = strncmp(base, "checkpoint-", 11) == 0 ? strtoll(base + 11, &end, 10) : -1;
        *step = end && end != base + 11 && *end == '\0' ? s : 0;
        *run_dir = parent_of(*ckpt);
        if (!*ckpt || !*run_dir) {
            free(*ckpt);
            free(*run_dir);
            *ckpt = *run_dir = NULL;
            return at_error(AT_ERR_NOMEM, "out of memory");
        }
        return AT_OK;
    }
    /* run folders v<N>-..., the highest N first */
    DIR *d = opendir(output_dir);
    if (!d)
        return at_error(AT_ERR_NOT_FOUND, "--resume_from_checkpoint last: %s: no runs (%s)", output_dir,
                        strerror(errno));
    long *ns = NULL;
    char **names = NULL;
    int n = 0, cap = 0;
    at_status st = AT_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end;
        if (e->d_name[0] != 'v') continue;
        long v = strtol(e->d_name + 1, &end, 10);
        if (end == e->d_name + 1 || *end != '-') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            long *nn = realloc(ns, (size_t)cap * sizeof *nn);
            char **nm = nn ? realloc(names, (size_t)cap * sizeof *nm) : NULL;
            if (nn) ns = nn;
            if (nm) names = nm;
            if (!nn || !nm) {
                st = at_error(AT_ERR_NOMEM, "out of memory");
                break;
            }
        }
        if (!(names[n] = strdup(e->d_name))) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        ns[n++] = v;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* descending N */
        for (int j = i; j > 0 && ns[j - 1] < ns[j]; j--) {
            long t = ns[j];
            ns[j] = ns[j - 1];
            ns[j - 1] = t;
            char *tn = names[j];
            names[j] = names[j - 1];
            names[j - 1] = tn;
        }
    st = st != AT_OK ? st : at_error(AT_ERR_NOT_FOUND, "--resume_from_checkpoint last: no complete checkpoint in any run "
                                                       "under %s", output_dir);
    for (int i = 0; i < n && st != AT_OK && st != AT_ERR_NOMEM; i++) {
        char *rd = at_path_join(output_dir, names[i]);
        if (!rd) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        if (at_is_dir(rd) && at_ckpt_find_last(rd, ckpt, step) == AT_OK) {
            if (i > 0)
                at_log_warn("--resume_from_checkpoint last: the newest run, %s/%s, has no complete checkpoint; "
                            "taking %s, if its options agree", output_dir, names[0], *ckpt);
            *run_dir = rd;
            st = AT_OK;
            break;
        }
        free(rd);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(ns);
    return st;
}
