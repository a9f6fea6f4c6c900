/* The reader of one offset range, in C: librdkafka's messages straight into Arrow buffers.
 *
 * offsetlake/read/native.py builds this file against the librdkafka that confluent-kafka loaded (the same
 * library, so one copy of it in the process) and reader.RangeReader drives it exactly as it drives
 * confluent-kafka's Consumer: the same settings, assign at the range's start, consume in chunks, the same
 * errors. What it saves is a Python object per message (confluent-kafka's Message, its key and value as
 * `bytes`) and the copy of every value from those objects into Arrow: here each message is copied once,
 * from librdkafka's buffer into the column it belongs to.
 *
 * A chunk is taken in two calls: ol_consume takes the messages and measures them (ol_sizes), Python
 * allocates the columns' buffers from Arrow's memory pool, and ol_fill copies the messages into them (Arrow's
 * layout: validity bitmaps least-significant bit first, int32 offsets) and lets the messages go. Arrow's
 * pool keeps the pages a chunk freed for the next; buffers of the C library's own would be fresh pages (a
 * page fault every 4 KiB) for every chunk larger than glibc's mmap threshold.
 */
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue;
    char *topic;
    int32_t partition;
    pthread_mutex_t errors_lock;
    char *client_errors; /* error_cb's reasons, each ended by '\n'; taken by ol_take_client_errors */
    size_t client_errors_len;
    rd_kafka_message_t **held; /* the last ol_consume's messages, until ol_fill */
    ssize_t held_count;
    int64_t end;
    int32_t with_headers;
} ol_reader;

/* What ol_consume took, measured: the sizes of the buffers ol_fill fills. */
typedef struct {
    int32_t cut;         /* 1 when a message at or past the end arrived: the range is read */
    int64_t length;      /* the messages kept: no error, offset below the range's end */
    int64_t last_offset; /* the last kept message's offset (-1 when none) */
    int64_t error_count;
    int64_t error_texts_len; /* each text ended by '\0' */
    int64_t keys_len;
    int64_t values_len;
    int64_t header_count;
    int64_t header_names_len;
    int64_t header_values_len;
} ol_sizes;

/* A binary (or string) column's buffers, as Python allocated them: offsets[n + 1], data, validity. */
typedef struct {
    int32_t *offsets;
    uint8_t *data;
    uint8_t *validity;
    int64_t null_count; /* set by ol_fill */
} ol_binary;

typedef struct {
    int32_t *error_codes;
    int64_t *error_offsets;
    char *error_texts;
    ol_binary keys;
    ol_binary values;
    int64_t *offsets;
    int64_t *timestamps;
    uint8_t *timestamp_validity;
    int64_t timestamp_null_count; /* set by ol_fill */
    int32_t *header_offsets;      /* headers only when asked for: map<string, binary> */
    ol_binary header_names;
    ol_binary header_values;
} ol_columns;

static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    (void)rk;
    (void)err;
    ol_reader *r = opaque;
    size_t len = strlen(reason);
    pthread_mutex_lock(&r->errors_lock);
    char *grown = realloc(r->client_errors, r->client_errors_len + len + 2);
    if (grown) {
        memcpy(grown + r->client_errors_len, reason, len);
        grown[r->client_errors_len + len] = '\n';
        grown[r->client_errors_len + len + 1] = '\0';
        r->client_errors = grown;
        r->client_errors_len += len + 1;
    }
    pthread_mutex_unlock(&r->errors_lock);
}

/* As confluent-kafka's logger at CRITICAL (reader.py): librdkafka's critical lines only, to stderr. */
static void on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    if (level <= 2) rd_kafka_log_print(rk, level, fac, buf);
}

static void set_error(char *errstr, size_t size, const char *what, const char *detail) {
    snprintf(errstr, size, "%s%s%s", what, detail && *detail ? ": " : "", detail ? detail : "");
}

void ol_close(ol_reader *r);

/* A consumer of one partition, assigned at `start`. NULL, with errstr set, when it cannot be made. */
ol_reader *ol_open(const char **names, const char **values, int count, const char *topic, int32_t partition,
                   int64_t start, char *errstr, size_t errstr_size) {
    ol_reader *r = calloc(1, sizeof *r);
    if (!r) {
        set_error(errstr, errstr_size, "out of memory", NULL);
        return NULL;
    }
    pthread_mutex_init(&r->errors_lock, NULL);
    r->partition = partition;
    r->topic = strdup(topic);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    for (int i = 0; i < count; i++) {
        if (rd_kafka_conf_set(conf, names[i], values[i], errstr, errstr_size) != RD_KAFKA_CONF_OK) {
            rd_kafka_conf_destroy(conf);
            ol_close(r);
            return NULL;
        }
    }
    rd_kafka_conf_set_opaque(conf, r);
    rd_kafka_conf_set_error_cb(conf, on_error);
    rd_kafka_conf_set_log_cb(conf, on_log);
    r->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, errstr_size);
    if (!r->rk) { /* rd_kafka_new destroyed nothing: the conf is still ours */
        rd_kafka_conf_destroy(conf);
        ol_close(r);
        return NULL;
    }
    rd_kafka_poll_set_consumer(r->rk); /* error_cb is served by consume, as in confluent-kafka */
    r->queue = rd_kafka_queue_get_consumer(r->rk);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, topic, partition)->offset = start;
    rd_kafka_resp_err_t err = rd_kafka_assign(r->rk, parts);
    rd_kafka_topic_partition_list_destroy(parts);
    if (err) {
        set_error(errstr, errstr_size, rd_kafka_err2str(err), NULL);
        ol_close(r);
        return NULL;
    }
    return r;
}

static void release_held(ol_reader *r) {
    for (ssize_t i = 0; i < r->held_count; i++) rd_kafka_message_destroy(r->held[i]);
    r->held_count = 0;
}

void ol_close(ol_reader *r) {
    if (!r) return;
    release_held(r);
    free(r->held);
    if (r->rk) {
        if (r->queue) rd_kafka_queue_destroy(r->queue);
        rd_kafka_consumer_close(r->rk);
        rd_kafka_destroy(r->rk);
    }
    pthread_mutex_destroy(&r->errors_lock);
    free(r->client_errors);
    free(r->topic);
    free(r);
}

/* The client errors reported since the last call, each ended by '\n', or NULL; free it with ol_free. */
char *ol_take_client_errors(ol_reader *r) {
    pthread_mutex_lock(&r->errors_lock);
    char *taken = r->client_errors;
    r->client_errors = NULL;
    r->client_errors_len = 0;
    pthread_mutex_unlock(&r->errors_lock);
    return taken;
}

void ol_free(void *p) { free(p); }

/* The consumer's position in its partition (what it will fetch next), or a negative librdkafka offset. */
int64_t ol_position(ol_reader *r) {
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, r->topic, r->partition);
    int64_t offset = -1001; /* RD_KAFKA_OFFSET_INVALID */
    if (!rd_kafka_position(r->rk, parts)) offset = parts->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(parts);
    return offset;
}

static void header_sizes(rd_kafka_message_t *m, ol_sizes *sizes) {
    rd_kafka_headers_t *headers;
    if (rd_kafka_message_headers(m, &headers)) return;
    const char *name;
    const void *value;
    size_t size;
    for (size_t i = 0; !rd_kafka_header_get_all(headers, i, &name, &value, &size); i++) {
        sizes->header_count++;
        sizes->header_names_len += (int64_t)strlen(name);
        sizes->header_values_len += value ? (int64_t)size : 0;
    }
}

#define INT32_LIMIT 2147483647LL

/* Takes up to `wanted` messages within `timeout_ms` and measures them into `sizes`; those at or past `end`
 * will be dropped (the next batch's). -1, with errstr set, when the consume failed as a whole or a column
 * would pass Arrow's 2 GiB; the messages are then let go. */
int ol_consume(ol_reader *r, int32_t wanted, int32_t timeout_ms, int64_t end, int32_t with_headers,
               ol_sizes *sizes, char *errstr, size_t errstr_size) {
    release_held(r);
    free(r->held);
    r->held = malloc(sizeof(*r->held) * (size_t)(wanted > 0 ? wanted : 1));
    if (!r->held) {
        set_error(errstr, errstr_size, "out of memory", NULL);
        return -1;
    }
    memset(sizes, 0, sizeof *sizes);
    sizes->last_offset = -1;
    ssize_t got = rd_kafka_consume_batch_queue(r->queue, timeout_ms, r->held, (size_t)wanted);
    if (got < 0) {
        set_error(errstr, errstr_size, rd_kafka_err2str(rd_kafka_last_error()), NULL);
        return -1;
    }
    r->held_count = got;
    r->end = end;
    r->with_headers = with_headers;
    for (ssize_t i = 0; i < got; i++) {
        rd_kafka_message_t *m = r->held[i];
        if (m->err) {
            sizes->error_count++;
            sizes->error_texts_len += (int64_t)strlen(rd_kafka_message_errstr(m)) + 1;
        } else if (m->offset >= end) {
            sizes->cut = 1;
        } else {
            sizes->length++;
            sizes->last_offset = m->offset;
            sizes->keys_len += m->key ? (int64_t)m->key_len : 0;
            sizes->values_len += m->payload ? (int64_t)m->len : 0;
            if (with_headers) header_sizes(m, sizes);
        }
    }
    if (sizes->keys_len > INT32_LIMIT || sizes->values_len > INT32_LIMIT || sizes->header_names_len > INT32_LIMIT ||
        sizes->header_values_len > INT32_LIMIT || sizes->header_count > INT32_LIMIT) {
        release_held(r);
        set_error(errstr, errstr_size, "one chunk of messages holds more than 2 GiB in a column", NULL);
        return -1;
    }
    return 0;
}

static void binary_start(ol_binary *b, int64_t length) {
    b->offsets[0] = 0;
    b->null_count = 0;
    memset(b->validity, 0, (size_t)(length + 7) / 8);
}

static void binary_put(ol_binary *b, int64_t i, const void *bytes, size_t len) {
    int32_t at = b->offsets[i];
    if (bytes) {
        memcpy(b->data + at, bytes, len);
        b->validity[i / 8] |= (uint8_t)(1u << (i % 8));
        b->offsets[i + 1] = at + (int32_t)len;
    } else {
        b->null_count++;
        b->offsets[i + 1] = at;
    }
}

/* Copies the messages ol_consume took into `c`'s buffers (allocated to its sizes) and lets them go. */
void ol_fill(ol_reader *r, ol_columns *c, const ol_sizes *sizes) {
    int64_t n = sizes->length, row = 0, header = 0, error = 0;
    size_t text_at = 0;
    binary_start(&c->keys, n);
    binary_start(&c->values, n);
    memset(c->timestamp_validity, 0, (size_t)(n + 7) / 8);
    c->timestamp_null_count = 0;
    if (r->with_headers) {
        binary_start(&c->header_names, sizes->header_count);
        binary_start(&c->header_values, sizes->header_count);
    }
    for (ssize_t i = 0; i < r->held_count; i++) {
        rd_kafka_message_t *m = r->held[i];
        if (m->err) {
            const char *text = rd_kafka_message_errstr(m);
            size_t len = strlen(text) + 1;
            memcpy(c->error_texts + text_at, text, len);
            text_at += len;
            c->error_codes[error] = m->err;
            c->error_offsets[error++] = m->offset;
        } else if (m->offset < r->end) {
            binary_put(&c->keys, row, m->key, m->key_len);
            binary_put(&c->values, row, m->payload, m->len);
            c->offsets[row] = m->offset;
            rd_kafka_timestamp_type_t kind;
            int64_t ms = rd_kafka_message_timestamp(m, &kind);
            if (kind == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE || ms < 0) {
                c->timestamps[row] = 0;
                c->timestamp_null_count++;
            } else {
                c->timestamps[row] = ms;
                c->timestamp_validity[row / 8] |= (uint8_t)(1u << (row % 8));
            }
            if (r->with_headers) {
                c->header_offsets[row] = (int32_t)header;
                rd_kafka_headers_t *headers;
                if (!rd_kafka_message_headers(m, &headers)) {
                    const char *name;
                    const void *value;
                    size_t size;
                    for (size_t h = 0; !rd_kafka_header_get_all(headers, h, &name, &value, &size); h++) {
                        binary_put(&c->header_names, header, name, strlen(name));
                        binary_put(&c->header_values, header, value, size);
                        header++;
                    }
                }
            }
            row++;
        }
    }
    if (r->with_headers) c->header_offsets[n] = (int32_t)header;
    release_held(r);
}
