/* Small parts the tokenizer's files share: buffers, UTF-8, Unicode classes,
 * the byte-level alphabet, the vocabulary index, piece lists. */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- buffers ------------------------------------------------------------ */

at_status tok_buf_reserve(tok_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return AT_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return AT_OK;
}

at_status tok_buf_put(tok_buf *b, const void *data, size_t n)
{
    AT_TRY(tok_buf_reserve(b, n));
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return AT_OK;
}

at_status tok_buf_putc(tok_buf *b, char c)
{
    return tok_buf_put(b, &c, 1);
}

void tok_buf_free(tok_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

char *tok_dup(const char *s, size_t n)
{
    char *c = malloc(n + 1);
    if (c) {
        memcpy(c, s, n);
        c[n] = '\0';
    }
    return c;
}

/* ---- UTF-8 -------------------------------------------------------------- */

int tok_utf8_len(uint8_t c)
{
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

int tok_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2; v = c & 0x1F; min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3; v = c & 0x0F; min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4; v = c & 0x07; min = 0x10000;
    } else {
        return 0;
    }
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

int tok_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

at_status tok_utf8_sanitize(const char *text, size_t len, tok_buf *out)
{
    const uint8_t *s = (const uint8_t *)text;
    out->len = 0;
    AT_TRY(tok_buf_reserve(out, len));
    size_t i = 0;
    while (i < len) {
        /* Copy runs of ASCII at once: the common case. */
        size_t j = i;
        while (j < len && s[j] < 0x80) j++;
        if (j > i) {
            AT_TRY(tok_buf_put(out, s + i, j - i));
            i = j;
            continue;
        }
        uint32_t cp;
        int k = tok_utf8_decode(s + i, len - i, &cp);
        if (k > 0) {
            AT_TRY(tok_buf_put(out, s + i, (size_t)k));
            i += (size_t)k;
        } else {
            /* from_utf8_lossy replaces the longest invalid prefix of a
             * would-be sequence with one U+FFFD; a stray byte alone. */
            size_t skip = 1;
            uint8_t c = s[i];
            int want = (c >= 0xC2 && c <= 0xDF) ? 2 : ((c & 0xF0) == 0xE0) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 1;
            while ((int)skip < want && i + skip < len && (s[i + skip] & 0xC0) == 0x80) {
                /* Second byte ranges that make the prefix invalid end it. */
                if (skip == 1) {
                    uint8_t d = s[i + 1];
                    if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F) || (c == 0xF0 && d < 0x90) ||
                        (c == 0xF4 && d > 0x8F))
                        break;
                }
                skip++;
            }
            AT_TRY(tok_buf_put(out, "\xEF\xBF\xBD", 3));
            i += skip;
        }
    }
    return AT_OK;
}

/* ---- Unicode classes ---------------------------------------------------- */

int tok_is_space(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
        cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
        return 1;
    return 0;
}

int tok_is_word(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    switch (c) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

int tok_is_numeric(uint32_t cp)
{
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

int tok_is_punct(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
               (cp >= 0x7B && cp <= 0x7E);
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

/* ---- byte-level alphabet ------------------------------------------------ */

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves,
 * the other 68 bytes for U+0100.. in byte order. */
const uint16_t tok_byte_cp[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271,
    272, 273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287,
    288, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79,
    80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
    96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 289,
    290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305,
    306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321,
    322, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 323, 174, 175,
    176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207,
    208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223,
    224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239,
    240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255,
};

char tok_byte_utf8[256][2];
uint8_t tok_byte_utf8_len[256];
static int16_t cp_to_byte[324];
static pthread_once_t byte_level_once = PTHREAD_ONCE_INIT;

static void byte_level_setup(void)
{
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        char tmp[4];
        int n = tok_utf8_encode(tok_byte_cp[b], tmp);
        tok_byte_utf8[b][0] = tmp[0];
        tok_byte_utf8[b][1] = n > 1 ? tmp[1] : 0;
        tok_byte_utf8_len[b] = (uint8_t)n;
        cp_to_byte[tok_byte_cp[b]] = (int16_t)b;
    }
}

void tok_byte_level_init(void)
{
    pthread_once(&byte_level_once, byte_level_setup);
}

int tok_cp_to_byte(uint32_t cp)
{
    return cp < 324 ? cp_to_byte[cp] : -1;
}

/* ---- vocabulary --------------------------------------------------------- */

uint64_t tok_hash(const void *data, size_t n)
{
    /* FNV-1a, 8 bytes at a time for speed, then a final mix. */
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    while (n--) h = (h ^ *p++) * 0x100000001b3ULL;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ULL;
    h ^= h >> 32;
    return h;
}

at_status tok_vocab_init(tok_vocab *v, int32_t n)
{
    memset(v, 0, sizeof *v);
    return tok_vocab_grow(v, n);
}

at_status tok_vocab_grow(tok_vocab *v, int32_t n)
{
    if (n <= v->n) return AT_OK;
    char **s = realloc(v->str, (size_t)n * sizeof *s);
    if (!s) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory for %d tokens", (int)n);
    v->str = s;
    uint32_t *l = realloc(v->len, (size_t)n * sizeof *l);
    if (!l) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory for %d tokens", (int)n);
    v->len = l;
    for (int32_t i = v->n; i < n; i++) {
        v->str[i] = NULL;
        v->len[i] = 0;
    }
    v->n = n;
    return AT_OK;
}

at_status tok_vocab_set(tok_vocab *v, int32_t id, const char *s, size_t len)
{
    if (id < 0) return at_error(AT_ERR_FORMAT, "tokenizer: negative token id %d", (int)id);
    if (id >= v->n) AT_TRY(tok_vocab_grow(v, id + 1 > v->n * 2 ? id + 1 : v->n * 2));
    char *c = tok_dup(s, len);
    if (!c) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
    free(v->str[id]);
    v->str[id] = c;
    v->len[id] = (uint32_t)len;
    return AT_OK;
}

at_status tok_vocab_index(tok_vocab *v)
{
    /* Trim unused ids at the end. */
    while (v->n > 0 && !v->str[v->n - 1]) v->n--;
    size_t cap = 16;
    while (cap < (size_t)v->n * 2) cap *= 2;
    free(v->slots);
    v->slots = malloc(cap * sizeof *v->slots);
    if (!v->slots) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory for the vocabulary index");
    memset(v->slots, 0xFF, cap * sizeof *v->slots);
    v->mask = (uint32_t)(cap - 1);
    for (int32_t id = 0; id < v->n; id++) {
        if (!v->str[id]) continue;
        uint32_t h = (uint32_t)tok_hash(v->str[id], v->len[id]) & v->mask;
        for (;;) {
            int32_t o = v->slots[h];
            if (o < 0) {
                v->slots[h] = id;
                break;
            }
            if (v->len[o] == v->len[id] && memcmp(v->str[o], v->str[id], v->len[id]) == 0) break;
            h = (h + 1) & v->mask;
        }
    }
    return AT_OK;
}

int32_t tok_vocab_find(const tok_vocab *v, const char *s, size_t len)
{
    if (!v->slots) return -1;
    uint32_t h = (uint32_t)tok_hash(s, len) & v->mask;
    for (;;) {
        int32_t o = v->slots[h];
        if (o < 0) return -1;
        if (v->len[o] == len && memcmp(v->str[o], s, len) == 0) return o;
        h = (h + 1) & v->mask;
    }
}

void tok_vocab_free(tok_vocab *v)
{
    if (v->str)
        for (int32_t i = 0; i < v->n; i++) free(v->str[i]);
    free(v->str);
    free(v->len);
    free(v->slots);
    memset(v, 0, sizeof *v);
}

/* ---- pieces --------------------------------------------------------------- */

at_status tok_pieces_add_ref(tok_pieces *p, uint32_t off, uint32_t len, int at_start)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        tok_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v) return at_error(AT_ERR_NOMEM, "tokenizer: out of memory");
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n].off = off;
    p->v[p->n].len = len;
    p->v[p->n].at_start = (uint8_t)at_start;
    p->n++;
    return AT_OK;
}

at_status tok_pieces_add(tok_pieces *p, const char *s, size_t len, int at_start)
{
    if (p->text.len + len > UINT32_MAX) return at_error(AT_ERR_INVALID, "tokenizer: text too long");
    uint32_t off = (uint32_t)p->text.len;
    AT_TRY(tok_buf_put(&p->text, s, len));
    return tok_pieces_add_ref(p, off, (uint32_t)len, at_start);
}

void tok_pieces_clear(tok_pieces *p)
{
    p->n = 0;
    p->text.len = 0;
}

void tok_pieces_free(tok_pieces *p)
{
    tok_buf_free(&p->text);
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}
