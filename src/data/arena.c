#include "data/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct at_arena_block {
    at_arena_block *next;
    size_t cap, used;
    /* 8-aligned payload follows (the header is a multiple of 8 bytes) */
};

#define AT_ARENA_BLOCK (1u << 16)

void *at_arena_alloc(at_arena *a, size_t size)
{
    size = (size + 7) & ~(size_t)7;
    if (size == 0) size = 8;
    at_arena_block *b = a->head;
    if (!b || b->cap - b->used < size) {
        /* Big requests get a block of their own so small ones keep filling
         * the current block. */
        size_t cap = size > AT_ARENA_BLOCK / 4 ? size : AT_ARENA_BLOCK;
        if (cap > SIZE_MAX - sizeof *b) return NULL;
        at_arena_block *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->cap = cap;
        nb->used = 0;
        if (b && cap != AT_ARENA_BLOCK) {
            /* keep the partly used block at the head */
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            a->head = nb;
        }
        b = nb;
    }
    void *p = (char *)(b + 1) + b->used;
    b->used += size;
    a->used_bytes += size;
    return p;
}

char *at_arena_strndup(at_arena *a, const char *s, size_t n)
{
    if (n == SIZE_MAX) return NULL;
    char *p = at_arena_alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void at_arena_free(at_arena *a)
{
    at_arena_block *b = a->head;
    while (b) {
        at_arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->used_bytes = 0;
}
