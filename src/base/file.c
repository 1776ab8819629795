#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Opens path for reading and stats it; anything but a regular file (a folder,
 * a device such as /dev/zero, a FIFO, a socket) is refused. O_NONBLOCK: a FIFO
 * must not hang the open before it can be refused. On success *fd is the
 * caller's to close. */
static at_status open_regular(const char *path, int *fd, struct stat *sb)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (*fd < 0) return at_error(AT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(*fd, sb) != 0) {
        int e = errno;
        close(*fd);
        *fd = -1;
        return at_error(AT_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb->st_mode)) {
        close(*fd);
        *fd = -1;
        return at_error(AT_ERR_IO, "%s: %s, not a regular file", path,
                        S_ISDIR(sb->st_mode) ? "a folder" : "a device, pipe or socket");
    }
    return AT_OK;
}

at_status at_map_file(const char *path, at_mapped_file *out)
{
    memset(out, 0, sizeof *out);
    out->fd = -1;
    int fd;
    struct stat sb;
    AT_TRY(open_regular(path, &fd, &sb));
    if (sb.st_size > 0) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return at_error(AT_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        out->data = p;
    }
    out->size = (size_t)sb.st_size;
    out->fd = fd;
    return AT_OK;
}

void at_unmap_file(at_mapped_file *m)
{
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    if (m->fd >= 0) close(m->fd);
    m->data = NULL;
    m->size = 0;
    m->fd = -1;
}

at_status at_read_head(const char *path, void *buf, size_t want, size_t *got)
{
    *got = 0;
    int fd;
    struct stat sb;
    AT_TRY(open_regular(path, &fd, &sb));
    at_status st = AT_OK;
    while (*got < want) {
        ssize_t r = read(fd, (char *)buf + *got, want - *got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = at_error(AT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        if (r <= 0) break;
        *got += (size_t)r;
    }
    close(fd);
    return st;
}

at_status at_read_file(const char *path, char **out, size_t *len)
{
    *out = NULL;
    int fd;
    struct stat sb;
    AT_TRY(open_regular(path, &fd, &sb));
    if (sb.st_size > AT_READ_FILE_MAX) {
        close(fd);
        return at_error(AT_ERR_FORMAT, "%s: %lld bytes, over the %d MiB that a file read whole may have", path,
                        (long long)sb.st_size, AT_READ_FILE_MAX >> 20);
    }
    /* the size may change while reading: read to the end, but never past the cap */
    size_t cap = (size_t)sb.st_size + 1 > 4096 ? (size_t)sb.st_size + 1 : 4096, n = 0;
    char *buf = malloc(cap);
    at_status st = AT_OK;
    if (!buf) {
        close(fd);
        return at_error(AT_ERR_NOMEM, "%s: out of memory reading file", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            if (cap > AT_READ_FILE_MAX) {
                st = at_error(AT_ERR_FORMAT, "%s: over the %d MiB that a file read whole may have", path,
                              AT_READ_FILE_MAX >> 20);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                st = at_error(AT_ERR_NOMEM, "%s: out of memory reading file", path);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = at_error(AT_ERR_IO, "%s: read error: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (st != AT_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return AT_OK;
}

at_status at_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return at_error(AT_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r != 0 && e != EINVAL) return at_error(AT_ERR_IO, "%s: fsync failed: %s", dir, strerror(e));
    return AT_OK;
}

at_status at_atomic_open(at_atomic_file *a, const char *path)
{
    a->fd = -1;
    a->path = strdup(path);
    size_t n = strlen(path) + 32;
    a->tmp = malloc(n);
    if (!a->path || !a->tmp) {
        at_atomic_abort(a);
        return at_error(AT_ERR_NOMEM, "out of memory");
    }
    snprintf(a->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (a->fd < 0) {
        at_status st = at_error(AT_ERR_IO, "%s: cannot create: %s", a->tmp, strerror(errno));
        at_atomic_abort(a);
        return st;
    }
    return AT_OK;
}

at_status at_atomic_write(at_atomic_file *a, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(a->fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return at_error(AT_ERR_IO, "%s: write failed: %s", a->tmp, strerror(errno));
        }
        p += w;
        len -= (size_t)w;
    }
    return AT_OK;
}

at_status at_atomic_zeros(at_atomic_file *a, size_t n)
{
    static const char zeros[256];
    while (n > 0) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        AT_TRY(at_atomic_write(a, zeros, k));
        n -= k;
    }
    return AT_OK;
}

void at_atomic_abort(at_atomic_file *a)
{
    if (a->fd >= 0) close(a->fd);
    if (a->tmp) unlink(a->tmp);
    free(a->tmp);
    free(a->path);
    a->fd = -1;
    a->tmp = NULL;
    a->path = NULL;
}

at_status at_atomic_commit(at_atomic_file *a)
{
    at_status st = AT_OK;
    if (fsync(a->fd) != 0) st = at_error(AT_ERR_IO, "%s: fsync failed: %s", a->tmp, strerror(errno));
    if (close(a->fd) != 0 && st == AT_OK) st = at_error(AT_ERR_IO, "%s: close failed: %s", a->tmp, strerror(errno));
    a->fd = -1;
    if (st == AT_OK && rename(a->tmp, a->path) != 0)
        st = at_error(AT_ERR_IO, "%s: cannot rename into place: %s", a->path, strerror(errno));
    if (st != AT_OK) {
        at_atomic_abort(a);
        return st;
    }
    free(a->tmp);
    a->tmp = NULL;
    /* the rename itself must reach the disk: fsync the folder */
    char *slash = strrchr(a->path, '/');
    if (!slash) {
        st = at_fsync_dir(".");
    } else if (slash == a->path) {
        st = at_fsync_dir("/");
    } else {
        *slash = '\0';
        st = at_fsync_dir(a->path);
    }
    free(a->path);
    a->path = NULL;
    return st;
}

at_status at_write_file_atomic(const char *path, const void *data, size_t len)
{
    at_atomic_file a;
    AT_TRY(at_atomic_open(&a, path));
    at_status st = at_atomic_write(&a, data, len);
    if (st != AT_OK) {
        at_atomic_abort(&a);
        return st;
    }
    return at_atomic_commit(&a);
}

at_status at_mkdirs(const char *path)
{
    char *p = strdup(path);
    if (!p) return at_error(AT_ERR_NOMEM, "out of memory");
    at_status st = AT_OK;
    for (char *s = p + 1; ; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                st = at_error(AT_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
                break;
            }
            *s = c;
            if (c == '\0') break;
        }
    }
    free(p);
    return st;
}

int at_file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

int at_is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

char *at_path_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *r = malloc(la + lb + 2);
    if (!r) return NULL;
    memcpy(r, a, la);
    size_t n = la;
    if (la > 0 && a[la - 1] != '/') r[n++] = '/';
    memcpy(r + n, b, lb + 1);
    return r;
}
