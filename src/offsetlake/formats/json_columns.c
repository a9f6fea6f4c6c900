/* JSON objects straight into Arrow columns, in C: the fast path before Arrow's JSON reader.
 *
 * offsetlake/formats/native_json.py builds this file and drives it. A parser is made once from a plan (a
 * struct of fields, each a struct, a list, a string, an int64, an int32, a double or a boolean); each call
 * reads an Arrow binary array of JSON texts, one object a value, one row a value, into that plan's columns
 * (Arrow's layout: validity bitmaps least-significant bit first, int32 offsets).
 *
 * It answers only where it is sure to read exactly what Arrow's JSON reader, and the reference parser behind
 * it, would; anywhere else it gives up (OL_GIVE_UP) and the caller asks Arrow. So it takes strict JSON only
 * (RFC 8259: no NaN, no comments, no leading zeros, no raw control characters in a string, UTF-8 with no
 * surrogate and no overlong form), and gives up on:
 * - a field given twice in one object, or an escaped key;
 * - a value of another JSON type than its field's (a number for a string, a float for an integer...);
 * - an integer outside its type, a number that is not finite as a double;
 * - an escaped lone surrogate (\ud800 alone), or nesting deeper than OL_DEEPEST.
 * Undeclared fields are read (their syntax checked) and left out. A missing field is null.
 *
 * A timestamp field (declared JSON's `timestamp`) is a string read as Arrow's cast reads it into microseconds
 * since the epoch, UTC: `YYYY-MM-DD[T ]HH:MM[:SS[.f{1,6}]]` then `Z`, `+HH:MM` or `-HH:MM`, or no zone (UTC).
 * Any other text, a date or time that does not exist, a value outside years 1 to 9999 in UTC, or texts with
 * and without a zone in one call give up: arrow_json decides those, as it did before this parser.
 */
#define _GNU_SOURCE /* strtod_l */
#include <locale.h>
#include <math.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arrow_buffers.h"

enum { K_STRUCT = 1, K_LIST = 2, K_STRING = 3, K_INT64 = 4, K_INT32 = 5, K_DOUBLE = 6, K_BOOL = 7, K_TIMESTAMP = 8 };
#define OL_DEEPEST 64

typedef struct ol_node {
    int32_t kind;
    int32_t child_count;
    struct ol_node *children;
    const char *name;
    int32_t name_len;
    int64_t seen_in;   /* the object (its number in this call) that last gave this field */
    int32_t last_hit;  /* struct: the child the last key matched; keys usually come in order */
    int32_t no_plain_key; /* the name holds a quote, backslash or control character: no key is it unescaped */
    int32_t zones;     /* timestamp: 1 if a text had a zone, 2 if one had none (both: give up) */
    int64_t length, null_count;
    ol_buf validity; /* bits */
    ol_buf values;   /* fixed width values, bool bits, or int32 offsets (string, list) */
    ol_buf data;     /* string bytes */
} ol_node;

typedef struct {
    ol_node root;
    int64_t objects; /* objects read in this call: each one's number for seen_in */
    int no_memory;
} ol_parser;

typedef struct {
    const uint8_t *p, *end;
    ol_parser *parser;
    int depth;
} ol_cursor;

static locale_t c_locale;
static void fill_stops(void);

/* ---------- the plan ---------- */

/* Empties `n`'s columns for a new call; -1: out of memory. */
static int reset_node(ol_node *n) {
    n->length = n->null_count = 0;
    n->validity.len = n->values.len = n->data.len = 0;
    n->seen_in = -1;
    n->last_hit = 0;
    n->zones = 0;
    if ((n->kind == K_STRING || n->kind == K_LIST) && put_offset(&n->values, 0)) return -1;
    for (int32_t i = 0; i < n->child_count; i++)
        if (reset_node(&n->children[i])) return -1;
    return 0;
}

static void free_node(ol_node *n) {
    for (int32_t i = 0; i < n->child_count; i++) free_node(&n->children[i]);
    free(n->children);
    free(n->validity.data);
    free(n->values.data);
    free(n->data.data);
}

/* Builds `n` from the plan in preorder (kinds, child counts, names) from *at on. */
static int build_node(ol_node *n, const int32_t *kinds, const int32_t *child_counts, const char **names,
                      const int32_t *name_lens, int32_t count, int32_t *at) {
    if (*at >= count) return -1;
    int32_t i = (*at)++;
    memset(n, 0, sizeof *n);
    n->kind = kinds[i];
    n->child_count = child_counts[i];
    n->name = names[i];
    n->name_len = name_lens[i];
    for (int32_t b = 0; b < n->name_len; b++)
        if ((uint8_t)n->name[b] < 0x20 || n->name[b] == '"' || n->name[b] == '\\') n->no_plain_key = 1;
    if ((n->kind == K_LIST && n->child_count != 1) || (n->kind != K_STRUCT && n->kind != K_LIST && n->child_count))
        return -1;
    if (n->child_count) {
        n->children = calloc((size_t)n->child_count, sizeof(ol_node));
        if (!n->children) return -1;
        for (int32_t c = 0; c < n->child_count; c++)
            if (build_node(&n->children[c], kinds, child_counts, names, name_lens, count, at)) return -1;
    }
    return 0;
}

void *ol_json_parser(const int32_t *kinds, const int32_t *child_counts, const char **names,
                     const int32_t *name_lens, int32_t count) {
    if (!c_locale) c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    fill_stops();
    ol_parser *parser = calloc(1, sizeof *parser);
    if (!parser || !c_locale) {
        free(parser);
        return NULL;
    }
    int32_t at = 0;
    if (build_node(&parser->root, kinds, child_counts, names, name_lens, count, &at) || at != count ||
        parser->root.kind != K_STRUCT) {
        free_node(&parser->root);
        free(parser);
        return NULL;
    }
    return parser;
}

void ol_json_parser_free(void *handle) {
    ol_parser *parser = handle;
    if (!parser) return;
    free_node(&parser->root);
    free(parser);
}

/* ---------- JSON text ---------- */

static void skip_space(ol_cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

static int literal(ol_cursor *c, const char *word, int len) {
    if (c->end - c->p < len || memcmp(c->p, word, (size_t)len)) return -1;
    c->p += len;
    return 0;
}

static int hex4(const uint8_t *p, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t h = p[i];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= (uint32_t)(h - '0');
        else if (h >= 'a' && h <= 'f') v |= (uint32_t)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') v |= (uint32_t)(h - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static void put_utf8(uint8_t *out, int *n, uint32_t cp) {
    if (cp < 0x80) out[(*n)++] = (uint8_t)cp;
    else if (cp < 0x800) {
        out[(*n)++] = (uint8_t)(0xC0 | (cp >> 6));
        out[(*n)++] = (uint8_t)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*n)++] = (uint8_t)(0xE0 | (cp >> 12));
        out[(*n)++] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (uint8_t)(0x80 | (cp & 0x3F));
    } else {
        out[(*n)++] = (uint8_t)(0xF0 | (cp >> 18));
        out[(*n)++] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        out[(*n)++] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (uint8_t)(0x80 | (cp & 0x3F));
    }
}

/* The bytes a string's plain run stops at: its end, an escape, a control character, non-ASCII. */
static uint8_t stops[256];

static void fill_stops(void) {
    for (int b = 0; b < 256; b++) stops[b] = b < 0x20 || b == '"' || b == '\\' || b >= 0x80;
}

/* A string at c->p (its opening quote), its text appended to `out` unless out is NULL; -1 gives up.
 * *escaped (unless NULL) is set when the text held an escape. */
static int string(ol_cursor *c, ol_buf *out, int *escaped) {
    c->p++;
    for (;;) {
        const uint8_t *run = c->p;
#ifdef __SSE2__
        /* 16 bytes at a time while none of them stops the run */
        const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), control = _mm_set1_epi8(0x1F);
        while (c->end - c->p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)c->p);
            __m128i stop = _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash));
            stop = _mm_or_si128(stop, _mm_cmpeq_epi8(_mm_max_epu8(v, control), control));
            int mask = _mm_movemask_epi8(stop) | _mm_movemask_epi8(v); /* v's sign bits: non-ASCII */
            if (mask) {
                c->p += __builtin_ctz((unsigned)mask);
                break;
            }
            c->p += 16;
        }
#endif
        while (c->p < c->end && !stops[*c->p]) c->p++;
        if (out && c->p > run && put(out, run, c->p - run)) return -2;
        if (c->p >= c->end) return -1;
        uint8_t b = *c->p;
        if (b == '"') {
            c->p++;
            return 0;
        }
        if (b < 0x20) return -1;
        if (b >= 0x80) {
            int n = utf8_length(c->p, c->end);
            if (!n) return -1;
            if (out && put(out, c->p, n)) return -2;
            c->p += n;
            continue;
        }
        /* an escape */
        if (escaped) *escaped = 1;
        if (c->end - c->p < 2) return -1;
        uint8_t e = c->p[1], one;
        c->p += 2;
        switch (e) {
            case '"': one = '"'; break;
            case '\\': one = '\\'; break;
            case '/': one = '/'; break;
            case 'b': one = '\b'; break;
            case 'f': one = '\f'; break;
            case 'n': one = '\n'; break;
            case 'r': one = '\r'; break;
            case 't': one = '\t'; break;
            case 'u': {
                uint32_t cp, low;
                if (c->end - c->p < 4 || hex4(c->p, &cp)) return -1;
                c->p += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || hex4(c->p + 2, &low) ||
                        low < 0xDC00 || low > 0xDFFF)
                        return -1;
                    c->p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                }
                uint8_t bytes[4];
                int n = 0;
                put_utf8(bytes, &n, cp);
                if (out && put(out, bytes, n)) return -2;
                continue;
            }
            default: return -1;
        }
        if (out && put(out, &one, 1)) return -2;
    }
}

/* A number at c->p by JSON's grammar; sets *integer when it has no fraction and no exponent. */
static int number(ol_cursor *c, const uint8_t **start, int *integer) {
    const uint8_t *p = c->p, *end = c->end;
    *start = p;
    *integer = 1;
    if (p < end && *p == '-') p++;
    if (p >= end) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9')
        while (p < end && *p >= '0' && *p <= '9') p++;
    else return -1;
    if (p < end && *p == '.') {
        *integer = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *integer = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    c->p = p;
    return 0;
}

/* After a member of an object or an array: 1 at a comma (another follows), 0 at `close` (the end), -1 at
 * anything else; the cursor passes the comma or `close`. */
static int after_member(ol_cursor *c, uint8_t close) {
    skip_space(c);
    if (c->p >= c->end) return -1;
    uint8_t b = *c->p++;
    return b == ',' ? 1 : b == close ? 0 : -1;
}

/* Any JSON value, its syntax checked, nothing kept. */
static int skip_value(ol_cursor *c) {
    if (c->p >= c->end) return -1;
    const uint8_t *start;
    int integer;
    switch (*c->p) {
        case '"': return string(c, NULL, NULL);
        case 't': return literal(c, "true", 4);
        case 'f': return literal(c, "false", 5);
        case 'n': return literal(c, "null", 4);
        case '{':
        case '[': {
            uint8_t close = *c->p == '{' ? '}' : ']';
            int object = close == '}';
            if (++c->depth > OL_DEEPEST) return -1;
            c->p++;
            skip_space(c);
            if (c->p < c->end && *c->p == close) {
                c->p++;
                c->depth--;
                return 0;
            }
            for (;;) {
                skip_space(c);
                if (object) {
                    if (c->p >= c->end || *c->p != '"' || string(c, NULL, NULL)) return -1;
                    skip_space(c);
                    if (c->p >= c->end || *c->p != ':') return -1;
                    c->p++;
                    skip_space(c);
                }
                if (skip_value(c)) return -1;
                int r = after_member(c, close);
                if (r > 0) continue;
                if (r) return r;
                c->depth--;
                return 0;
            }
        }
        default: return number(c, &start, &integer);
    }
}

static int value(ol_cursor *c, ol_node *n);

/* A null slot in `n` and, for a struct, in each of its fields (Arrow's reader makes them null too). */
static int append_null(ol_node *n) {
    if (put_bit(&n->validity, n->length, 0)) return -2;
    switch (n->kind) {
        case K_STRUCT:
            for (int32_t i = 0; i < n->child_count; i++)
                if (append_null(&n->children[i])) return -2;
            break;
        case K_LIST: {
            int32_t last;
            memcpy(&last, n->values.data + n->values.len - 4, 4);
            if (put(&n->values, &last, 4)) return -2;
            break;
        }
        case K_STRING:
            if (put_offset(&n->values, n->data.len)) return -2;
            break;
        case K_INT64:
        case K_TIMESTAMP:
        case K_DOUBLE: {
            int64_t zero = 0;
            if (put(&n->values, &zero, 8)) return -2;
            break;
        }
        case K_INT32: {
            int32_t zero = 0;
            if (put(&n->values, &zero, 4)) return -2;
            break;
        }
        case K_BOOL:
            if (put_bit(&n->values, n->length, 0)) return -2;
            break;
    }
    n->length++;
    n->null_count++;
    return 0;
}

static ol_node *field_named(ol_node *n, const uint8_t *key, int64_t len) {
    for (int32_t tried = 0; tried < n->child_count; tried++) {
        int32_t i = (n->last_hit + tried) % n->child_count;
        ol_node *child = &n->children[i];
        if (child->name_len == len && !memcmp(child->name, key, (size_t)len)) {
            n->last_hit = (i + 1) % n->child_count;
            return child;
        }
    }
    return NULL;
}

/* The field after the last one matched, when the key at c->p (its opening quote) is exactly its name: then
 * the cursor passes the key. A declared name has no quote, backslash or control character (no_plain_key), so
 * its bytes and a closing quote are the whole key, unescaped. */
static inline ol_node *expected_key(ol_cursor *c, ol_node *n) {
    if (!n->child_count) return NULL;
    ol_node *next = &n->children[n->last_hit];
    int64_t len = next->name_len;
    if (next->no_plain_key || c->end - c->p < len + 2 || c->p[len + 1] != '"' || memcmp(c->p + 1, next->name, (size_t)len))
        return NULL;
    c->p += len + 2;
    n->last_hit = (n->last_hit + 1) % n->child_count;
    return next;
}

static int object(ol_cursor *c, ol_node *n) {
    int64_t me = c->parser->objects++;
    if (++c->depth > OL_DEEPEST) return -1;
    c->p++;
    skip_space(c);
    if (c->p < c->end && *c->p == '}') c->p++;
    else
        for (;;) {
            skip_space(c);
            if (c->p >= c->end || *c->p != '"') return -1;
            ol_node *field = expected_key(c, n);
            if (!field) {
                const uint8_t *key = c->p + 1;
                int escaped = 0;
                int r = string(c, NULL, &escaped);
                if (r) return r;
                if (escaped) return -1;
                field = field_named(n, key, c->p - 1 - key);
            }
            skip_space(c);
            if (c->p >= c->end || *c->p != ':') return -1;
            c->p++;
            skip_space(c);
            int r;
            if (field) {
                if (field->seen_in == me) return -1;
                field->seen_in = me;
                r = value(c, field);
            } else
                r = skip_value(c);
            if (r) return r;
            if ((r = after_member(c, '}')) <= 0) {
                if (r) return r;
                break;
            }
        }
    for (int32_t i = 0; i < n->child_count; i++)
        if (n->children[i].seen_in != me && append_null(&n->children[i])) return -2;
    c->depth--;
    if (put_bit(&n->validity, n->length, 1)) return -2;
    n->length++;
    return 0;
}

static int list(ol_cursor *c, ol_node *n) {
    ol_node *item = &n->children[0];
    if (++c->depth > OL_DEEPEST) return -1;
    c->p++;
    skip_space(c);
    if (c->p < c->end && *c->p == ']') c->p++;
    else
        for (;;) {
            skip_space(c);
            int r = value(c, item);
            if (r) return r;
            if ((r = after_member(c, ']')) <= 0) {
                if (r) return r;
                break;
            }
        }
    c->depth--;
    if (put_offset(&n->values, item->length) || put_bit(&n->validity, n->length, 1)) return -2;
    n->length++;
    return 0;
}

static int integer_value(ol_cursor *c, ol_node *n) {
    const uint8_t *start;
    int integer;
    if (number(c, &start, &integer) || !integer) return -1;
    int negative = *start == '-';
    uint64_t magnitude = 0;
    const uint64_t limit = n->kind == K_INT64 ? (uint64_t)INT64_MAX + negative : (uint64_t)INT32_MAX + negative;
    for (const uint8_t *d = start + negative; d < c->p; d++) {
        if (magnitude > (limit - (uint64_t)(*d - '0')) / 10) return -1;
        magnitude = magnitude * 10 + (uint64_t)(*d - '0');
    }
    if (n->kind == K_INT64) {
        int64_t v = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
        if (put(&n->values, &v, 8)) return -2;
    } else {
        int32_t v = negative ? (int32_t)(0 - (uint32_t)magnitude) : (int32_t)magnitude;
        if (put(&n->values, &v, 4)) return -2;
    }
    return 0;
}

/* A number's exact value when its digits fit a double's 53 bits and its power of ten is exact too (10^22 at
 * most): one correctly rounded multiplication or division then gives the correctly rounded value (Clinger). */
static int exact_double(const uint8_t *p, const uint8_t *end, double *out) {
    static const double powers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    int negative = *p == '-';
    uint64_t mantissa = 0;
    int digits = 0, scale = 0;
    p += negative;
    for (; p < end && *p >= '0' && *p <= '9'; p++, digits++) mantissa = mantissa * 10 + (uint64_t)(*p - '0');
    if (p < end && *p == '.')
        for (p++; p < end && *p >= '0' && *p <= '9'; p++, digits++, scale--)
            mantissa = mantissa * 10 + (uint64_t)(*p - '0');
    if (p != end || digits > 15 || scale < -22) return -1; /* an exponent, or too many digits: strtod */
    double v = (double)mantissa / powers[-scale];
    *out = negative ? -v : v;
    return 0;
}

static int double_value(ol_cursor *c, ol_node *n) {
    const uint8_t *start;
    int integer;
    char text[128];
    double exact;
    if (number(c, &start, &integer)) return -1;
    if (!exact_double(start, c->p, &exact)) return put(&n->values, &exact, 8) ? -2 : 0;
    int64_t len = c->p - start;
    if (len >= (int64_t)sizeof text) return -1;
    memcpy(text, start, (size_t)len);
    text[len] = 0;
    double v = strtod_l(text, NULL, c_locale); /* correctly rounded, as Arrow's and Python's readers */
    if (!isfinite(v)) return -1;
    return put(&n->values, &v, 8) ? -2 : 0;
}

static int digits(const uint8_t *p, int n, int *out) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    *out = v;
    return 0;
}

/* Days from 1970-01-01 to a date of the proleptic Gregorian calendar (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

#define FIRST_MICROS (-62135596800000000LL) /* 0001-01-01T00:00:00Z */
#define LAST_MICROS 253402300799999999LL    /* 9999-12-31T23:59:59.999999Z */

/* The timestamp text t[0..len) in microseconds since the epoch, UTC; *zoned: it named its zone. */
static int timestamp_micros(const uint8_t *t, int64_t len, int64_t *out, int *zoned) {
    static const int month_days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int y, mo, d, h, mi, sec = 0, micros = 0;
    if (len < 16 || digits(t, 4, &y) || t[4] != '-' || digits(t + 5, 2, &mo) || t[7] != '-' ||
        digits(t + 8, 2, &d) || (t[10] != 'T' && t[10] != ' ') || digits(t + 11, 2, &h) || t[13] != ':' ||
        digits(t + 14, 2, &mi))
        return -1;
    int64_t i = 16;
    if (i < len && t[i] == ':') {
        if (len - i < 3 || digits(t + i + 1, 2, &sec)) return -1;
        i += 3;
        if (i < len && t[i] == '.') {
            int64_t first = ++i;
            while (i < len && t[i] >= '0' && t[i] <= '9') i++;
            int64_t n = i - first;
            if (n < 1 || n > 6) return -1;
            digits(t + first, (int)n, &micros);
            for (int64_t k = n; k < 6; k++) micros *= 10;
        }
    }
    int64_t offset_minutes = 0;
    *zoned = i < len;
    if (i < len) {
        int oh, om;
        if (t[i] == 'Z' && i + 1 == len) {
        } else if ((t[i] == '+' || t[i] == '-') && len - i == 6 && !digits(t + i + 1, 2, &oh) && t[i + 3] == ':' &&
                   !digits(t + i + 4, 2, &om) && oh <= 23 && om <= 59) {
            offset_minutes = (t[i] == '-' ? -1 : 1) * (oh * 60 + om);
        } else
            return -1;
    }
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > month_days[mo - 1] + (mo == 2 && leap) || h > 23 || mi > 59 ||
        sec > 59)
        return -1;
    int64_t seconds = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - offset_minutes * 60;
    int64_t v = seconds * 1000000 + micros;
    if (v < FIRST_MICROS || v > LAST_MICROS) return -1;
    *out = v;
    return 0;
}

static int timestamp_value(ol_cursor *c, ol_node *n) {
    const uint8_t *start = c->p + 1;
    int escaped = 0, zoned;
    int64_t micros;
    if (string(c, NULL, &escaped) || escaped) return -1;
    if (timestamp_micros(start, c->p - 1 - start, &micros, &zoned)) return -1;
    n->zones |= zoned ? 1 : 2;
    if (n->zones == 3) return -1;
    return put(&n->values, &micros, 8) ? -2 : 0;
}

/* A value of field `n` at c->p. 0: read; -1: give up; -2: out of memory. */
static int value(ol_cursor *c, ol_node *n) {
    if (c->p >= c->end) return -1;
    if (*c->p == 'n') return literal(c, "null", 4) ? -1 : append_null(n);
    int r;
    switch (n->kind) {
        case K_STRUCT:
            return *c->p == '{' ? object(c, n) : -1;
        case K_LIST:
            return *c->p == '[' ? list(c, n) : -1;
        case K_STRING:
            if (*c->p != '"') return -1;
            r = string(c, &n->data, NULL);
            if (r) return r;
            if (put_offset(&n->values, n->data.len)) return -2;
            break;
        case K_TIMESTAMP:
            if (*c->p != '"') return -1;
            r = timestamp_value(c, n);
            if (r) return r;
            break;
        case K_INT64:
        case K_INT32:
            if (*c->p != '-' && (*c->p < '0' || *c->p > '9')) return -1;
            r = integer_value(c, n);
            if (r) return r;
            break;
        case K_DOUBLE:
            if (*c->p != '-' && (*c->p < '0' || *c->p > '9')) return -1;
            r = double_value(c, n);
            if (r) return r;
            break;
        case K_BOOL:
            if (*c->p == 't') {
                if (literal(c, "true", 4)) return -1;
                if (put_bit(&n->values, n->length, 1)) return -2;
            } else if (*c->p == 'f') {
                if (literal(c, "false", 5)) return -1;
                if (put_bit(&n->values, n->length, 0)) return -2;
            } else
                return -1;
            break;
        default: return -1;
    }
    if (put_bit(&n->validity, n->length, 1)) return -2;
    n->length++;
    return 0;
}

/* Reads `count` values (an Arrow binary array's int32 offsets and data, the first at offsets[0]) into the
 * plan's columns, replacing the last call's. OL_OK, OL_GIVE_UP (Arrow decides: a value above), or
 * OL_NO_MEMORY. A value must be one JSON object, with JSON whitespace around it at most. */
int ol_json_parse(void *handle, const int32_t *offsets, const uint8_t *data, int64_t count) {
    ol_parser *parser = handle;
    if (reset_node(&parser->root)) return OL_NO_MEMORY;
    parser->objects = 0;
    for (int64_t i = 0; i < count; i++) {
        ol_cursor c = {data + offsets[i], data + offsets[i + 1], parser, 0};
        skip_space(&c);
        if (c.p >= c.end || *c.p != '{') return OL_GIVE_UP;
        int r = object(&c, &parser->root);
        if (r == -2) return OL_NO_MEMORY;
        if (r) return OL_GIVE_UP;
        skip_space(&c);
        if (c.p != c.end) return OL_GIVE_UP;
    }
    return OL_OK;
}

static ol_node *nth(ol_node *n, int32_t *left) {
    if ((*left)-- == 0) return n;
    for (int32_t i = 0; i < n->child_count; i++) {
        ol_node *found = nth(&n->children[i], left);
        if (found) return found;
    }
    return NULL;
}

int ol_json_column(void *handle, int32_t index, ol_column *out) {
    ol_parser *parser = handle;
    int32_t left = index;
    ol_node *n = nth(&parser->root, &left);
    if (!n) return -1;
    column_of(out, n->length, n->null_count, &n->validity, &n->values, &n->data);
    return 0;
}
