/* A bump allocator: many small allocations (strings, message arrays) that
 * live as long as a dataset and are released together. */
#ifndef AT_DATA_ARENA_H
#define AT_DATA_ARENA_H

#include <stddef.h>

typedef struct at_arena_block at_arena_block;

typedef struct {
    at_arena_block *head; /* newest block first */
    size_t used_bytes;    /* total handed out, for statistics */
} at_arena;               /* zero-initialize before use */

/* size bytes aligned to 8, owned by the arena; NULL when out of memory. */
void *at_arena_alloc(at_arena *a, size_t size);
/* Copies s[0..n) and appends a NUL; NULL when out of memory. */
char *at_arena_strndup(at_arena *a, const char *s, size_t n);
/* Releases every allocation; the arena is empty (and reusable) afterwards. */
void at_arena_free(at_arena *a);

#endif
