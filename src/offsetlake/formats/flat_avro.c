/* Flat Avro records straight into Arrow columns, in C: the fast path before polars' Avro reader.
 *
 * offsetlake/formats/native_avro.py drives it for avro.FlatAvro: records of one writer schema whose fields
 * are primitives (boolean, int, long, float, double, string, bytes), enums, or ["null", T] / [T, "null"]
 * unions of those. Each payload (one record's Avro binary encoding, its frame cut off) is decoded field by
 * field and must end exactly where its last field ends. The columns come out as Avro's plain types (an
 * enum as its index, a date or timestamp as its int or long); avro.py turns them into the table's types as
 * it turns polars' columns.
 *
 * It gives up (OL_GIVE_UP: polars, then fastavro record by record, decide) on anything it is not sure
 * every reader reads alike: a payload longer or shorter than its fields, a varint of more than 10 bytes or
 * in a longer form than needed, an int outside 32 bits, a boolean byte other than 0 or 1, a union branch
 * other than 0 or 1, an enum index outside its symbols, a negative length, a string that is not UTF-8.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arrow_buffers.h"

enum { A_BOOLEAN = 1, A_INT = 2, A_LONG = 3, A_FLOAT = 4, A_DOUBLE = 5, A_STRING = 6, A_BYTES = 7, A_ENUM = 8 };
enum { NOT_NULL = 0, NULL_FIRST = 1, NULL_LAST = 2 };

typedef struct {
    int32_t kind, nullable, symbols;
    int64_t null_count;
    ol_buf validity, values, data;
} avro_field;

typedef struct {
    int32_t count;
    int64_t length;
    avro_field *fields;
} avro_parser;

void *ol_avro_parser(const int32_t *kinds, const int32_t *nullables, const int32_t *symbols, int32_t count) {
    avro_parser *parser = calloc(1, sizeof *parser);
    if (!parser) return NULL;
    parser->fields = calloc((size_t)(count ? count : 1), sizeof(avro_field));
    if (!parser->fields) {
        free(parser);
        return NULL;
    }
    parser->count = count;
    for (int32_t i = 0; i < count; i++) {
        parser->fields[i].kind = kinds[i];
        parser->fields[i].nullable = nullables[i];
        parser->fields[i].symbols = symbols[i];
    }
    return parser;
}

void ol_avro_parser_free(void *handle) {
    avro_parser *parser = handle;
    if (!parser) return;
    for (int32_t i = 0; i < parser->count; i++) {
        free(parser->fields[i].validity.data);
        free(parser->fields[i].values.data);
        free(parser->fields[i].data.data);
    }
    free(parser->fields);
    free(parser);
}

/* A zigzag varint in its shortest form; -1 gives up. */
static inline int varint(const uint8_t **p, const uint8_t *end, int64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*p >= end) return -1;
        uint8_t b = *(*p)++;
        if (shift == 63 && b > 1) return -1;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            if (b == 0 && shift) return -1; /* a longer form than needed */
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
    }
    return -1;
}

static int value(const uint8_t **p, const uint8_t *end, avro_field *f, int64_t row) {
    int64_t v;
    switch (f->kind) {
        case A_BOOLEAN:
            if (*p >= end || **p > 1) return -1;
            if (put_bit(&f->values, row, **p)) return -2;
            (*p)++;
            return 0;
        case A_INT:
        case A_ENUM: {
            if (varint(p, end, &v) || v < INT32_MIN || v > INT32_MAX) return -1;
            if (f->kind == A_ENUM && (v < 0 || v >= f->symbols)) return -1;
            int32_t i = (int32_t)v;
            return put(&f->values, &i, 4) ? -2 : 0;
        }
        case A_LONG:
            if (varint(p, end, &v)) return -1;
            return put(&f->values, &v, 8) ? -2 : 0;
        case A_FLOAT:
        case A_DOUBLE: {
            int64_t width = f->kind == A_FLOAT ? 4 : 8;
            if (end - *p < width) return -1;
            if (put(&f->values, *p, width)) return -2; /* little-endian, as Avro writes it */
            *p += width;
            return 0;
        }
        case A_STRING:
        case A_BYTES: {
            if (varint(p, end, &v) || v < 0 || v > end - *p) return -1;
            const uint8_t *s = *p, *stop = *p + v;
            if (f->kind == A_STRING)
                for (const uint8_t *q = s; q < stop;) {
                    if (*q < 0x80) {
                        q++;
                        continue;
                    }
                    int n = utf8_length(q, stop);
                    if (!n) return -1;
                    q += n;
                }
            if (put(&f->data, s, v) || put_offset(&f->values, f->data.len)) return -2;
            *p = stop;
            return 0;
        }
    }
    return -1;
}

static int null_value(avro_field *f, int64_t row) {
    int64_t zero = 0;
    f->null_count++;
    switch (f->kind) {
        case A_BOOLEAN: return put_bit(&f->values, row, 0);
        case A_INT:
        case A_ENUM:
        case A_FLOAT: return put(&f->values, &zero, 4);
        case A_LONG:
        case A_DOUBLE: return put(&f->values, &zero, 8);
        default: return put_offset(&f->values, f->data.len);
    }
}

static int record(const uint8_t *p, const uint8_t *end, avro_parser *parser, int64_t row) {
    for (int32_t i = 0; i < parser->count; i++) {
        avro_field *f = &parser->fields[i];
        int present = 1;
        if (f->nullable != NOT_NULL) {
            if (p >= end || (*p != 0 && *p != 2)) return -1; /* branch 0 or 1, zigzag encoded */
            int branch = *p++ >> 1;
            present = f->nullable == NULL_FIRST ? branch == 1 : branch == 0;
        }
        if (put_bit(&f->validity, row, present)) return -2;
        int r = present ? value(&p, end, f, row) : (null_value(f, row) ? -2 : 0);
        if (r) return r;
    }
    return p == end ? 0 : -1;
}

/* Decodes `count` payloads (an Arrow binary array's int32 offsets and data, the first at offsets[0]) into
 * the fields' columns, replacing the last call's: OL_OK, OL_GIVE_UP or OL_NO_MEMORY. */
int ol_avro_parse(void *handle, const int32_t *offsets, const uint8_t *data, int64_t count) {
    avro_parser *parser = handle;
    for (int32_t i = 0; i < parser->count; i++) {
        avro_field *f = &parser->fields[i];
        f->validity.len = f->values.len = f->data.len = 0;
        f->null_count = 0;
        if ((f->kind == A_STRING || f->kind == A_BYTES) && put_offset(&f->values, 0)) return OL_NO_MEMORY;
    }
    parser->length = 0;
    for (int64_t row = 0; row < count; row++) {
        int r = record(data + offsets[row], data + offsets[row + 1], parser, row);
        if (r == -2) return OL_NO_MEMORY;
        if (r) return OL_GIVE_UP;
    }
    parser->length = count;
    return OL_OK;
}

int ol_avro_column(void *handle, int32_t index, ol_column *out) {
    avro_parser *parser = handle;
    if (index < 0 || index >= parser->count) return -1;
    avro_field *f = &parser->fields[index];
    column_of(out, parser->length, f->null_count, &f->validity, &f->values, &f->data);
    return 0;
}
