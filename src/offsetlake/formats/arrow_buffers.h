/* Arrow buffers built in C: what json_columns.c and flat_avro.c share (offsetlake/formats/native.py builds
 * them into one library). Buffers grow as values are appended and are reused from call to call; the caller
 * copies a column out (ol_column) before the next call. Arrow's layout: validity and boolean bitmaps
 * least-significant bit first, int32 offsets. */
#ifndef OL_ARROW_BUFFERS_H
#define OL_ARROW_BUFFERS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OL_OK = 0, OL_GIVE_UP = 1, OL_NO_MEMORY = 2 };

typedef struct {
    uint8_t *data;
    int64_t len, cap;
} ol_buf;

static inline int reserve(ol_buf *b, int64_t more) {
    if (b->len + more <= b->cap) return 0;
    int64_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + more) cap *= 2;
    uint8_t *grown = realloc(b->data, (size_t)cap);
    if (!grown) return -1;
    b->data = grown;
    b->cap = cap;
    return 0;
}

static inline int put_bit(ol_buf *bits, int64_t index, int on) {
    int64_t byte = index >> 3;
    if (byte >= bits->len) {
        if (reserve(bits, byte + 1 - bits->len)) return -1;
        memset(bits->data + bits->len, 0, (size_t)(byte + 1 - bits->len));
        bits->len = byte + 1;
    }
    if (on) bits->data[byte] |= (uint8_t)(1u << (index & 7));
    return 0;
}

static inline int put(ol_buf *b, const void *bytes, int64_t n) {
    if (reserve(b, n)) return -1;
    memcpy(b->data + b->len, bytes, (size_t)n);
    b->len += n;
    return 0;
}

static inline int put_offset(ol_buf *offsets, int64_t offset) {
    if (offset > INT32_MAX) return -1;
    int32_t o = (int32_t)offset;
    return put(offsets, &o, 4);
}

/* The length of the well-formed UTF-8 sequence at p (lead byte >= 0x80), or 0. */
static inline int utf8_length(const uint8_t *p, const uint8_t *end) {
    uint8_t b = p[0];
    int n;
    uint32_t least;
    if (b >= 0xC2 && b <= 0xDF) n = 2, least = 0x80;
    else if (b >= 0xE0 && b <= 0xEF) n = 3, least = 0x800;
    else if (b >= 0xF0 && b <= 0xF4) n = 4, least = 0x10000;
    else return 0;
    if (end - p < n) return 0;
    uint32_t cp = b & (0x3F >> (n - 1));
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < least || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

/* One column's buffers after a parse; the parser keeps owning them (they live until its next call: the
 * caller copies them before that). */
typedef struct {
    int64_t length, null_count;
    const uint8_t *validity, *values, *data;
    int64_t validity_len, values_len, data_len;
} ol_column;

static inline void column_of(ol_column *out, int64_t length, int64_t null_count, const ol_buf *validity,
                             const ol_buf *values, const ol_buf *data) {
    out->length = length;
    out->null_count = null_count;
    out->validity = validity->data;
    out->validity_len = validity->len;
    out->values = values->data;
    out->values_len = values->len;
    out->data = data ? data->data : NULL;
    out->data_len = data ? data->len : 0;
}

#endif
