#include "base/manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "base/sha256.h"

static int g_checks = 1;

void at_manifest_set_checks(int on)
{
    g_checks = on;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* Sorted names of the files in dir (except hidden ones and the manifest). */
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
        if (e->d_name[0] == '.' || !strcmp(e->d_name, AT_MANIFEST)) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(*names, (size_t)cap * sizeof *nn);
            if (!nn) {
                st = at_error(AT_ERR_NOMEM, "out of memory");
                break;
            }
            *names = nn;
        }
        if (!((*names)[*n] = strdup(e->d_name))) {
            st = at_error(AT_ERR_NOMEM, "out of memory");
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (st != AT_OK) {
        free_names(*names, *n);
        *names = NULL;
        *n = 0;
        return st;
    }
    if (*n > 1) qsort(*names, (size_t)*n, sizeof **names, cmp_str);
    return AT_OK;
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

at_status at_manifest_write(const char *dir)
{
    char **names = NULL;
    int n = 0;
    char *manifest = NULL;
    size_t cap = 4096, len = 0;
    at_status st = list_files(dir, &names, &n);
    if (st != AT_OK) goto done;
    manifest = malloc(cap);
    if (!manifest) {
        st = at_error(AT_ERR_NOMEM, "out of memory");
        goto done;
    }
    manifest[0] = '\0';
    for (int i = 0; i < n; i++) {
        char *p = at_path_join(dir, names[i]);
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
    char *mpath = at_path_join(dir, AT_MANIFEST);
    st = mpath ? at_write_file_atomic(mpath, manifest, len) : at_error(AT_ERR_NOMEM, "out of memory");
    free(mpath);
done:
    free_names(names, n);
    free(manifest);
    return st;
}

/* strict: files the manifest does not list are an error too. */
static at_status verify(const char *dir, int strict)
{
    char *mpath = at_path_join(dir, AT_MANIFEST);
    char *text = NULL;
    char **names = NULL;
    int n = 0, listed = 0;
    at_status st = AT_OK;
    if (!mpath) return at_error(AT_ERR_NOMEM, "out of memory");
    if (!at_is_dir(dir)) {
        st = at_error(AT_ERR_NOT_FOUND, "%s: no such folder", dir);
        goto done;
    }
    if (!at_file_exists(mpath)) {
        st = at_error(AT_ERR_FORMAT, "%s: no %s: the folder is incomplete (a save that did not finish) or was "
                      "not written by anytune", dir, AT_MANIFEST);
        goto done;
    }
    if (at_read_file(mpath, &text, NULL) != AT_OK) {
        st = at_error(AT_ERR_FORMAT, "%s: unreadable %s: %s", dir, AT_MANIFEST, at_last_error());
        goto done;
    }
    AT_CHECK(list_files(dir, &names, &n));
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (*line) {
            if (strlen(line) < 67 || line[64] != ' ' || line[65] != ' ') {
                st = at_error(AT_ERR_FORMAT, "%s: malformed line in %s", dir, AT_MANIFEST);
                goto done;
            }
            const char *fname = line + 66;
            char *p = at_path_join(dir, fname);
            char hex[65];
            if (!p || strchr(fname, '/')) {
                free(p);
                st = at_error(AT_ERR_FORMAT, "%s: bad file name in %s", dir, AT_MANIFEST);
                goto done;
            }
            st = at_sha256_file(p, hex);
            free(p);
            if (st != AT_OK) {
                st = at_error(AT_ERR_FORMAT, "%s: %s is listed in the manifest but missing", dir, fname);
                goto done;
            }
            if (strncmp(hex, line, 64) != 0) {
                st = at_error(AT_ERR_FORMAT, "%s: %s does not match its hash in %s (damaged or changed since it "
                              "was written%s)", dir, fname, AT_MANIFEST, strict ? "" : "; --no_verify reads it anyway");
                goto done;
            }
            listed++;
        }
        if (!nl) break;
        line = nl + 1;
    }
    if (strict && listed != n) st = at_error(AT_ERR_FORMAT, "%s: holds files that %s does not list", dir, AT_MANIFEST);
done:
    free(mpath);
    free(text);
    free_names(names, n);
    return st;
}

at_status at_manifest_verify(const char *dir)
{
    return verify(dir, 1);
}

at_status at_manifest_check(const char *dir)
{
    if (!g_checks || !at_is_dir(dir)) return AT_OK;
    char *mpath = at_path_join(dir, AT_MANIFEST);
    if (!mpath) return at_error(AT_ERR_NOMEM, "out of memory");
    int has = at_file_exists(mpath);
    free(mpath);
    return has ? verify(dir, 0) : AT_OK;
}
