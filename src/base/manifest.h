/* MANIFEST.sha256: the hashes of every file of a folder (a checkpoint, an
 * export), in sha256sum's format ("<hex>  <name>\n", sorted by name).
 * Written last, it lets whoever reads the folder later check that nothing
 * was damaged or changed since. */
#ifndef AT_BASE_MANIFEST_H
#define AT_BASE_MANIFEST_H

#include "base/status.h"

#define AT_MANIFEST "MANIFEST.sha256"

/* fsyncs every regular file of dir (names starting with '.' and the
 * manifest itself excepted), then writes dir/MANIFEST.sha256 atomically. */
at_status at_manifest_write(const char *dir);

/* Checks dir against its manifest: every listed file present with its hash,
 * and no unlisted file. The error names the file. */
at_status at_manifest_verify(const char *dir);

/* What the readers of checkpoints and exports (infer, serve, eval, export,
 * a trainer's --model / --adapters) call on a folder they load, when dir
 * holds a manifest and checks are on: every listed file present with its
 * hash (a file added since, say a README, is no harm). AT_OK when it has no
 * manifest (a folder not written by anytune). */
at_status at_manifest_check(const char *dir);

/* Turns the checks of at_manifest_check off (--no_verify) or on (default)
 * for the whole process. */
void at_manifest_set_checks(int on);

#endif
