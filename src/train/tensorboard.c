#include "train/tensorboard.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "base/file.h"

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- CRC-32C: reflected polynomial 0x82f63b78, one table of 256 ---- */

static uint32_t crc_table[256];
static int crc_ready;

uint32_t at_crc32c(const void *data, size_t n)
{
    if (!crc_ready) { /* filling it twice from two threads writes the same values */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
            crc_table[i] = c;
        }
        crc_ready = 1;
    }
    const unsigned char *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static uint32_t masked_crc(const void *data, size_t n)
{
    uint32_t c = at_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protobuf encoding, the few wire types an Event needs ---- */

typedef struct {
    unsigned char *b;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *o, const void *p, size_t n)
{
    if (o->oom) return;
    if (o->n + n > o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        while (cap < o->n + n) cap *= 2;
        unsigned char *nb = realloc(o->b, cap);
        if (!nb) {
            o->oom = 1;
            return;
        }
        o->b = nb;
        o->cap = cap;
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void put_varint(buf *o, uint64_t v)
{
    unsigned char t[10];
    size_t k = 0;
    do {
        t[k] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) t[k] |= 0x80;
        k++;
    } while (v);
    put(o, t, k);
}

static void put_le(buf *o, uint64_t v, int bytes)
{
    unsigned char t[8];
    for (int i = 0; i < bytes; i++) t[i] = (unsigned char)(v >> (8 * i));
    put(o, t, (size_t)bytes);
}

/* field numbers and wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
static void put_key(buf *o, int field, int wire) { put_varint(o, (uint64_t)field << 3 | (uint64_t)wire); }

static void put_bytes(buf *o, int field, const void *p, size_t n)
{
    put_key(o, field, 2);
    put_varint(o, n);
    put(o, p, n);
}

static void put_double(buf *o, int field, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    put_key(o, field, 1);
    put_le(o, u, 8);
}

static void put_float(buf *o, int field, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    put_key(o, field, 5);
    put_le(o, u, 4);
}

/* One TFRecord of data. */
static at_status write_record(at_tb_writer *w, const buf *data)
{
    buf r = {0};
    put_le(&r, data->n, 8);
    put_le(&r, masked_crc(r.b, 8), 4);
    put(&r, data->b, data->n);
    put_le(&r, masked_crc(data->b, data->n), 4);
    at_status st = AT_OK;
    if (r.oom) st = at_error(AT_ERR_NOMEM, "out of memory");
    else if (fwrite(r.b, 1, r.n, w->f) != r.n || fflush(w->f) != 0)
        st = at_error(AT_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    free(r.b);
    return st;
}

at_status at_tb_open(at_tb_writer *w, const char *dir)
{
    memset(w, 0, sizeof *w);
    AT_TRY(at_mkdirs(dir));
    char host[256] = "localhost", name[400];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    double now = wall_seconds();
    snprintf(name, sizeof name, "events.out.tfevents.%lld.%s.%ld.0", (long long)now, host, (long)getpid());
    w->path = at_path_join(dir, name);
    if (!w->path) return at_error(AT_ERR_NOMEM, "out of memory");
    w->f = fopen(w->path, "wb");
    if (!w->f) {
        at_status st = at_error(AT_ERR_IO, "%s: cannot create: %s", w->path, strerror(errno));
        at_tb_close(w);
        return st;
    }
    /* Event { wall_time = 1; file_version = 3 } */
    buf e = {0};
    put_double(&e, 1, now);
    put_bytes(&e, 3, "brain.Event:2", 13);
    at_status st = e.oom ? at_error(AT_ERR_NOMEM, "out of memory") : write_record(w, &e);
    free(e.b);
    if (st != AT_OK) at_tb_close(w);
    return st;
}

at_status at_tb_write_scalars(at_tb_writer *w, int64_t step, const cJSON *line)
{
    /* Summary { repeated Value value = 1 }, Value { string tag = 1; float simple_value = 2 } */
    buf s = {0};
    for (const cJSON *it = line ? line->child : NULL; it; it = it->next) {
        if (!cJSON_IsNumber(it) || !it->string || !strcmp(it->string, "step")) continue;
        char tag[256];
        if (!strncmp(it->string, "eval_", 5)) snprintf(tag, sizeof tag, "eval/%s", it->string + 5);
        else snprintf(tag, sizeof tag, "train/%s", it->string);
        buf v = {0};
        put_bytes(&v, 1, tag, strlen(tag));
        put_float(&v, 2, (float)it->valuedouble);
        put_bytes(&s, 1, v.b, v.n);
        if (v.oom) s.oom = 1;
        free(v.b);
    }
    at_status st = AT_OK;
    if (s.n || s.oom) {
        /* Event { wall_time = 1; step = 2; summary = 5 } */
        buf e = {0};
        put_double(&e, 1, wall_seconds());
        put_key(&e, 2, 0);
        put_varint(&e, (uint64_t)step);
        put_bytes(&e, 5, s.b, s.n);
        st = e.oom || s.oom ? at_error(AT_ERR_NOMEM, "out of memory") : write_record(w, &e);
        free(e.b);
    }
    free(s.b);
    return st;
}

void at_tb_close(at_tb_writer *w)
{
    if (w->f) fclose(w->f);
    free(w->path);
    memset(w, 0, sizeof *w);
}
