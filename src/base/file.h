/* Files: read-only memory maps, whole-file reads, atomic writes. */
#ifndef AT_BASE_FILE_H
#define AT_BASE_FILE_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

typedef struct {
    const uint8_t *data; /* NULL for an empty file */
    size_t size;
    int fd;
} at_mapped_file;

/* Maps path read-only. Release with at_unmap_file. */
at_status at_map_file(const char *path, at_mapped_file *out);
void at_unmap_file(at_mapped_file *m);

/* Reads the whole file into a new NUL-terminated buffer (*out, caller frees
 * with free()); *len excludes the NUL. len may be NULL. Every file read whole
 * (JSON, YAML, templates, tokenizer files, CSV, logs) goes through here: a
 * path that is not a regular file (a folder, /dev/zero, a FIFO) is refused,
 * and so is a file over AT_READ_FILE_MAX bytes (the largest tokenizer.json
 * known, Gemma's, is about 35 MB); model weights are mapped (at_map_file). */
#define AT_READ_FILE_MAX (256 << 20)
at_status at_read_file(const char *path, char **out, size_t *len);

/* The first `want` bytes of a regular file (a magic number), into buf;
 * *got < want when the file is shorter. A folder, device, FIFO or socket is
 * refused without blocking, as by at_read_file. */
at_status at_read_head(const char *path, void *buf, size_t want, size_t *got);

/* Writes data to path atomically: a temporary file beside it, fsync, rename. */
at_status at_write_file_atomic(const char *path, const void *data, size_t len);

/* A file written in pieces that appears at its path only when whole: the
 * bytes go to a temporary name beside it; commit fsyncs, renames it into
 * place and fsyncs the folder; abort (or a failed commit) removes it. */
typedef struct {
    int fd;
    char *tmp;  /* owned */
    char *path; /* owned */
} at_atomic_file;

at_status at_atomic_open(at_atomic_file *a, const char *path);
at_status at_atomic_write(at_atomic_file *a, const void *data, size_t len);
/* Writes n zero bytes (padding). */
at_status at_atomic_zeros(at_atomic_file *a, size_t n);
at_status at_atomic_commit(at_atomic_file *a);
void at_atomic_abort(at_atomic_file *a); /* safe after commit and on a zeroed struct with fd -1 */

/* fsyncs a directory (after renames into it). */
at_status at_fsync_dir(const char *dir);

/* mkdir -p. */
at_status at_mkdirs(const char *path);

int at_file_exists(const char *path);
int at_is_dir(const char *path);

/* Joins a and b with '/' into a new string (caller frees). */
char *at_path_join(const char *a, const char *b);

#endif
