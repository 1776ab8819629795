#include "data/thrift.h"

static uint64_t varint(at_thrift *t)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (t->p >= t->end) break;
        uint8_t b = *t->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    t->err = 1; /* truncated, or longer than 10 bytes */
    return 0;
}

static int64_t zigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

int64_t at_thrift_i64(at_thrift *t) { return zigzag(varint(t)); }

int at_thrift_field(at_thrift *t, int16_t *last, int16_t *id, int *type)
{
    if (t->err || t->p >= t->end) {
        t->err = 1;
        return 0;
    }
    uint8_t b = *t->p++;
    if (b == AT_TT_STOP) return 0;
    *type = b & 0x0f;
    int delta = b >> 4;
    int64_t v = delta ? *last + delta : at_thrift_i64(t);
    if (v < -32768 || v > 32767) t->err = 1;
    *id = (int16_t)v;
    *last = *id;
    return !t->err;
}

const uint8_t *at_thrift_binary(at_thrift *t, size_t *len)
{
    uint64_t n = varint(t);
    *len = 0;
    if (t->err || n > (uint64_t)(t->end - t->p)) {
        t->err = 1;
        return NULL;
    }
    const uint8_t *s = t->p;
    t->p += n;
    *len = (size_t)n;
    return s;
}

size_t at_thrift_list(at_thrift *t, int *elem_type)
{
    if (t->err || t->p >= t->end) {
        t->err = 1;
        return 0;
    }
    uint8_t b = *t->p++;
    *elem_type = b & 0x0f;
    uint64_t n = b >> 4;
    if (n == 15) n = varint(t);
    /* every element takes at least one byte (booleans too, in lists) */
    if (t->err || n > (uint64_t)(t->end - t->p)) {
        t->err = 1;
        return 0;
    }
    return (size_t)n;
}

int at_thrift_enter(at_thrift *t)
{
    if (++t->depth > AT_THRIFT_MAX_DEPTH) t->err = 1;
    return !t->err;
}

void at_thrift_leave(at_thrift *t) { t->depth--; }

static void advance(at_thrift *t, size_t n)
{
    if (n > (size_t)(t->end - t->p)) t->err = 1;
    else t->p += n;
}

static void skip_elem(at_thrift *t, int type);

void at_thrift_skip(at_thrift *t, int type)
{
    if (t->err) return;
    switch (type) {
    case AT_TT_TRUE:
    case AT_TT_FALSE: break; /* the value is in the field header */
    case AT_TT_BYTE: advance(t, 1); break;
    case AT_TT_I16:
    case AT_TT_I32:
    case AT_TT_I64: (void)varint(t); break;
    case AT_TT_DOUBLE: advance(t, 8); break;
    case AT_TT_BINARY: (void)at_thrift_binary(t, &(size_t){0}); break;
    case AT_TT_LIST:
    case AT_TT_SET: {
        int et;
        size_t n = at_thrift_list(t, &et);
        if (!at_thrift_enter(t)) return;
        for (size_t i = 0; i < n && !t->err; i++) skip_elem(t, et);
        at_thrift_leave(t);
        break;
    }
    case AT_TT_MAP: {
        uint64_t n = varint(t);
        if (t->err || n > (uint64_t)(t->end - t->p)) {
            t->err = 1;
            return;
        }
        if (n == 0) break;
        if (t->p >= t->end) {
            t->err = 1;
            return;
        }
        uint8_t kv = *t->p++;
        if (!at_thrift_enter(t)) return;
        for (uint64_t i = 0; i < n && !t->err; i++) {
            skip_elem(t, kv >> 4);
            skip_elem(t, kv & 0x0f);
        }
        at_thrift_leave(t);
        break;
    }
    case AT_TT_STRUCT: {
        if (!at_thrift_enter(t)) return;
        int16_t last = 0, id;
        int ft;
        while (at_thrift_field(t, &last, &id, &ft)) at_thrift_skip(t, ft);
        at_thrift_leave(t);
        break;
    }
    default: t->err = 1; break;
    }
}

/* Inside lists and maps a boolean takes a byte of its own. */
static void skip_elem(at_thrift *t, int type)
{
    if (type == AT_TT_TRUE || type == AT_TT_FALSE) advance(t, 1);
    else at_thrift_skip(t, type);
}
