/* What hub.c and hub_select.c share: a repository's file list. */
#ifndef AT_HUB_HUB_INTERNAL_H
#define AT_HUB_HUB_INTERNAL_H

#include <stddef.h>
#include "hub/hub.h"

typedef struct {
    char *path;    /* relative, checked */
    char *blob;    /* HF: the blob's name (LFS sha256 or git blob id) */
    char *sha256;  /* to check, or NULL */
    long long size; /* -1 unknown */
} at_hub_file;

typedef struct {
    at_hub_kind hub;
    at_repo_kind kind;
    char repo[200];  /* ORG/NAME */
    char rev[200];
    char commit[64]; /* HF: the revision's commit */
    char *root;      /* the repository's cache folder */
    char *files_dir; /* HF: snapshots/<commit>; ModelScope: root */
    at_hub_file *files;
    size_t n;
    const char *endpoint;
} at_hub_listing;

/* Which files a model needs (or --include / --gguf_file choose): keep[i] set
 * for each; an error when none is. */
at_status at_hub_select_model(const at_hub_options *o, const at_hub_listing *L, char *keep);
/* A dataset's train-split data files (of SUBSET when not ""); returns how many. */
size_t at_hub_select_data(const at_hub_listing *L, const char *subset, char *keep);
/* In the Hub's Parquet conversion (refs/convert/parquet): SUBSET (or
 * "default")/train/ and /partial-train/ files; returns how many. */
size_t at_hub_select_converted(const at_hub_listing *L, const char *subset, char *keep);

#endif
