/* The output folder of an export, written so that a crash or an error never
 * leaves something at the final name that looks whole:
 *
 *   at_export_begin   checks OUT (an existing OUT is refused unless
 *                     overwrite) and creates an empty staging folder
 *                     OUT.tmp-PID beside it (and removes the OUT.tmp-PID
 *                     and OUT.old-PID of exports killed before they could);
 *   ...               the exporter writes its files into the staging folder
 *                     (each one atomically and fsynced);
 *   at_export_commit  writes MANIFEST.sha256 (sha256sum format, sorted by
 *                     name: base/manifest.h), renames
 *                     the staging folder to OUT (an old OUT, when overwriting,
 *                     is moved aside first and removed after), fsyncs the
 *                     parent;
 *   at_export_abort   removes the staging folder (on any error). */
#ifndef AT_EXPORT_EXPORT_FILES_H
#define AT_EXPORT_EXPORT_FILES_H

#include <stdint.h>
#include "base/status.h"

/* Starts an export to out_dir. *staging is a new string (caller frees): the
 * folder to write into. Refuses (AT_ERR_INVALID) an existing out_dir unless
 * overwrite, and a path that exists and is not a folder even then. */
at_status at_export_begin(const char *out_dir, int overwrite, char **staging);

/* Seals the export (see above). On error the staging folder is left for
 * at_export_abort. */
at_status at_export_commit(const char *staging, const char *out_dir);

/* Removes the staging folder; NULL ok. Keeps the current error message. */
void at_export_abort(const char *staging);

/* Copies file src to dst (atomically). */
at_status at_export_copy_file(const char *src, const char *dst);

/* Parses a size such as "5GB", "500MB", "2GiB", "1048576" (decimal units are
 * powers of 1000, *iB powers of 1024, as Hugging Face's max_shard_size). */
at_status at_export_parse_size(const char *s, int64_t *out);

#endif
