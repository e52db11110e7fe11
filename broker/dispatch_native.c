/* broker._dispatch_native: the broker's per-message loops for the usual message, in C.
 *
 * Every replica reads every message it applies: the stored-message record's fixed fields, its
 * topic and properties (TAGS, KEYS, UNIQ_KEY), the Java hashes of the tag and of the index keys,
 * then writes one ConsumeQueue unit and an IndexFile item per key; the leader also writes each
 * proposed record's offsets and packs each batch send's records. In Python those loops were
 * most of the CPU a message cost (docs/decisions.md, "The dispatcher's loop in C"). Four
 * functions do them here; broker/state.py, broker/index_file.py and broker/send.py call them
 * and keep everything else (files, rolls, events, refusals, the unusual message) in Python:
 *
 *   scan(payloads, positions, kinds, data_kind, start, header_bytes, special_topics,
 *        stop_keys, items_max) -> (stop, runs, items)
 *
 *     Reads entries start, start+1, ... of an applied batch (skipping those not of kind
 *     `data_kind`) while each is a message the Python dispatcher would treat as plain: a V1
 *     record with IPv4 hosts whose size, lengths and physical offset hold, an ASCII topic
 *     of RocketMQ's topic characters that is not one of `special_topics`, a non-negative queue
 *     id, properties with none of `stop_keys`, an ASCII TAGS, and ASCII index keys, fewer than
 *     `items_max` of them. It stops at the first entry that is anything else (`stop`; the
 *     caller dispatches that one in Python and calls again after it) or at the end; with
 *     `positions` None (not read yet for the batch) it stops at the first record.
 *     `runs`: [(topic, queue_id, first_queue_offset, units)], the ConsumeQueue units (20 bytes
 *     each, big-endian physical offset, size, tag hash) of consecutive queue offsets of one
 *     queue, in the order the queues first appear. A message whose queue offset does not
 *     follow its queue's run in this scan stops the scan, so every run is contiguous.
 *     `items`: the IndexFile items in message order, ITEM_BYTES each (native byte order):
 *     key hash (u32), the message's item count on its first item and 0 on the others (u32),
 *     physical offset (i64), store timestamp (i64).
 *
 *   index_put(mm, items, at, slot_count, item_count, index_count, hash_slot_count,
 *             begin_timestamp, begin_phy_offset, end_timestamp, end_phy_offset)
 *     -> (at, index_count, hash_slot_count, begin_timestamp, begin_phy_offset,
 *         end_timestamp, end_phy_offset)
 *
 *     Puts the items of whole messages from item `at` on into one mapped IndexFile as
 *     IndexFile.put does, skipping a message at or before end_phy_offset (a replay) and
 *     stopping at a message that does not fit (the caller rolls a new file and calls again).
 *
 *   shape(payloads, positions, start, first_index, header_bytes, next_offsets, stop_keys,
 *         placed_type, shaped, keys, placed) -> stop
 *
 *     The leader's half (BrokerState.shape): for each proposed entry from `start` on that is a
 *     plain record (as scan reads them) with none of `stop_keys` anywhere in its properties and
 *     whose queue's next offset is in `next_offsets` ({(topic, queue_id): offset}), appends the
 *     record with that queue offset and its physical offset (positions[k] + header_bytes)
 *     written to `shaped`, advances the offset, appends the key to `keys` and
 *     (first_index + k, placed_type(queue_id, offset, physical_offset)) to `placed`. Stops
 *     at the first entry that is anything else; returns its index (or the length).
 *
 *   pack_batch(body, head, topic_part, cluster_pair, markers, record_max, properties_max,
 *              messages_max, crc) -> (records, first_properties) | None
 *
 *     A send handler's half (broker/send.py): the stored records of a SEND_BATCH_MESSAGE body
 *     whose messages are all plain (none of `markers` anywhere in their properties): each is
 *     `head` (the 88 fixed bytes the request's messages share, from stored_message.Packer)
 *     with its size, body CRC (`crc(body) & 0x7FFFFFFF`), flag and body length written, then
 *     its body, `topic_part`, and its properties with `cluster_pair` appended. None for
 *     anything the Python path would refuse or treat otherwise (a malformed batch, more than
 *     messages_max messages, a marker, a record or properties over their bounds): the caller
 *     then runs that path, which names the refusal.
 *
 *   send_ok_frames(answering, placed, first, parts, json, responses) -> rest
 *
 *     The leader's SEND_OK frames for a committed run (broker/send.py _send_oks): for each
 *     ((slot, prepared), index) of `answering` whose prepared has one record, no half and a
 *     request with the `json` serialization, writes into responses[slot] the frame of the
 *     JSON header parts[0] opaque parts[1] physical-offset parts[2] queue-id parts[3]
 *     queue-offset parts[4] (decimal, then 16 upper-case hex digits, then decimal twice),
 *     the physical and queue offsets from placed[index - first] and the queue id from the
 *     prepared; returns the other items, for the Python path.
 *
 * The Python code remains the definition: tests/broker/test_dispatch_native.py holds each
 * function to it (the same ConsumeQueue and IndexFile bytes, records, offsets and placements
 * for arbitrary and damaged input).
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAGIC_V1 0xDAA320A7u
#define FIXED_V4 88 /* the fixed fields of a V1 record with IPv4 hosts */
#define UNIT_BYTES 20
#define ITEM_BYTES 24
#define INDEX_HEADER_BYTES 40
#define INDEX_SLOT_BYTES 4
#define INDEX_ITEM_BYTES 20
#define TIME_DIFF_MAX 2147483647LL
#define TRANSACTION_TYPE_MASK 0xC
#define TRANSACTION_ROLLBACK 0xC
#define TOPIC_MAX 127

typedef struct {
    uint32_t key_hash;
    uint32_t count; /* the message's item count on its first item, else 0 */
    int64_t physical_offset;
    int64_t store_timestamp;
} Item;

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* Java's String.hashCode of ASCII text, continued from h (one UTF-16 unit per byte). */
static uint32_t java_hash(uint32_t h, const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) h = 31u * h + p[i];
    return h;
}

static int is_ascii(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] & 0x80) return 0;
    return 1;
}

static int topic_char(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '%' || c == '|' || c == '_' || c == '-';
}

/* IndexFile.indexKeyHashMethod: abs of the signed hash, 0 for Integer.MIN_VALUE. */
static uint32_t index_key_hash(uint32_t h) {
    int32_t s = (int32_t)h;
    if (h == 0x80000000u) return 0;
    return (uint32_t)(s < 0 ? -s : s);
}


/* Whether `data` equals one of the bytes objects in the tuple `names`. */
static int equals_any(const unsigned char *data, Py_ssize_t length, PyObject *names) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (PyBytes_Check(name) && PyBytes_GET_SIZE(name) == length &&
            memcmp(PyBytes_AS_STRING(name), data, (size_t)length) == 0)
            return 1;
    }
    return 0;
}

/* The fields of a stored-message record as read_dispatch's fast path reads them: a V1 record
 * with IPv4 hosts whose size is the payload's length and whose body, topic and properties
 * lengths add up to it, with a topic of 1-127 of RocketMQ's topic characters and a queue id
 * >= 0. Anything else (V2, IPv6, damage, other topics) is 0: left to the Python code. */
typedef struct {
    int32_t size, sys_flag;
    long queue_id;
    int64_t queue_offset, physical_offset, store_timestamp;
    const unsigned char *topic, *properties;
    Py_ssize_t topic_length, properties_length;
} Record;

static int read_plain(PyObject *payload, Record *r) {
    if (!PyBytes_CheckExact(payload)) return 0;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t length = PyBytes_GET_SIZE(payload);
    if (length < FIXED_V4 + 3) return 0;
    int32_t size = (int32_t)be32(b);
    if (size != length || be32(b + 4) != MAGIC_V1) return 0;
    int32_t sys_flag = (int32_t)be32(b + 36);
    if (sys_flag & 0x30) return 0; /* IPv6 hosts */
    int32_t body_length = (int32_t)be32(b + 84);
    if (body_length < 0 || (int64_t)FIXED_V4 + body_length + 3 > size) return 0;
    Py_ssize_t topic_at = FIXED_V4 + body_length + 1;
    Py_ssize_t topic_length = b[FIXED_V4 + body_length];
    Py_ssize_t props_at = topic_at + topic_length;
    if (props_at + 2 > size) return 0;
    int16_t props_length = (int16_t)((b[props_at] << 8) | b[props_at + 1]);
    if (props_length < 0 || props_at + 2 + props_length != size) return 0;
    if (topic_length < 1 || topic_length > TOPIC_MAX) return 0;
    for (Py_ssize_t i = 0; i < topic_length; i++)
        if (!topic_char(b[topic_at + i])) return 0;
    long queue_id = (long)(int32_t)be32(b + 12);
    if (queue_id < 0) return 0;
    r->size = size;
    r->sys_flag = sys_flag;
    r->queue_id = queue_id;
    r->queue_offset = (int64_t)be64(b + 20);
    r->physical_offset = (int64_t)be64(b + 28);
    r->store_timestamp = (int64_t)be64(b + 56);
    r->topic = b + topic_at;
    r->topic_length = topic_length;
    r->properties = b + props_at + 2;
    r->properties_length = props_length;
    return 1;
}

/* positions[k] + header_bytes into *out: 0, or -1 with an exception set. */
static int position_at(PyObject *positions, Py_ssize_t k, long long header_bytes, int64_t *out) {
    if (!PyList_Check(positions) || k >= PyList_GET_SIZE(positions)) {
        PyErr_SetString(PyExc_ValueError, "positions is not a list as long as the payloads");
        return -1;
    }
    long long position = PyLong_AsLongLong(PyList_GET_ITEM(positions, k));
    if (position == -1 && PyErr_Occurred()) return -1;
    *out = position + header_bytes;
    return 0;
}

typedef struct {
    const unsigned char *topic;
    Py_ssize_t topic_length;
    long queue_id;
    int64_t first_offset;
    int64_t next_offset;
    unsigned char *units;
    Py_ssize_t count, capacity;
} Run;

typedef struct {
    Run *runs;
    Py_ssize_t count, capacity;
    Item *items;
    Py_ssize_t item_count, item_capacity;
} ScanOut;

static void scan_out_free(ScanOut *out) {
    for (Py_ssize_t i = 0; i < out->count; i++) PyMem_Free(out->runs[i].units);
    PyMem_Free(out->runs);
    PyMem_Free(out->items);
}

/* One properties pair's value, the last occurrence winning (remoting.properties.table). */
typedef struct {
    const unsigned char *value;
    Py_ssize_t length;
    int present;
} Found;

static int key_is(const unsigned char *key, Py_ssize_t n, const char *name) {
    size_t len = strlen(name);
    return (size_t)n == len && memcmp(key, name, len) == 0;
}

static int grow(void **buffer, Py_ssize_t *capacity, Py_ssize_t need, size_t size) {
    if (need <= *capacity) return 0;
    Py_ssize_t capacity_new = *capacity ? *capacity : 16;
    while (capacity_new < need) capacity_new *= 2;
    void *grown = PyMem_Realloc(*buffer, (size_t)capacity_new * size);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buffer = grown;
    *capacity = capacity_new;
    return 0;
}

/* The hashes of a message's index keys (topic#UNIQ_KEY, then topic#k for each KEYS entry):
 * how many, or -1 when the message is not plain (non-ASCII, or items_max or more keys). */
static Py_ssize_t key_hashes(const unsigned char *topic, Py_ssize_t topic_length,
                             Found *uniq, Found *keys, uint32_t *hashes, Py_ssize_t items_max) {
    uint32_t prefix = java_hash(java_hash(0, topic, topic_length), (const unsigned char *)"#", 1);
    Py_ssize_t n = 0;
    if (uniq->present && uniq->length > 0) {
        if (!is_ascii(uniq->value, uniq->length)) return -1;
        hashes[n++] = index_key_hash(java_hash(prefix, uniq->value, uniq->length));
    }
    if (keys->present && keys->length > 0) {
        if (!is_ascii(keys->value, keys->length)) return -1;
        const unsigned char *p = keys->value, *end = keys->value + keys->length;
        while (p < end) {
            const unsigned char *space = memchr(p, ' ', (size_t)(end - p));
            const unsigned char *stop = space ? space : end;
            if (stop > p) {
                if (n + 1 >= items_max) return -1;
                hashes[n++] = index_key_hash(java_hash(prefix, p, stop - p));
            }
            p = stop + 1;
        }
    }
    if (n >= items_max) return -1;
    return n;
}

#define HASHES_MAX 256 /* more keys than this in one message: the Python path */

static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *payloads, *positions, *kinds, *special_topics, *stop_keys;
    long data_kind;
    Py_ssize_t start, items_max;
    long long header_bytes;
    if (!PyArg_ParseTuple(args, "O!OO!lnLO!O!n", &PyList_Type, &payloads, &positions,
                          &PyList_Type, &kinds, &data_kind, &start, &header_bytes, &PyTuple_Type,
                          &special_topics, &PyTuple_Type, &stop_keys, &items_max))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(payloads);
    if (PyList_GET_SIZE(kinds) != n) {
        PyErr_SetString(PyExc_ValueError, "kinds and payloads differ in length");
        return NULL;
    }
    if (items_max > HASHES_MAX) items_max = HASHES_MAX;
    ScanOut out = {0};
    uint32_t hashes[HASHES_MAX];
    Py_ssize_t k = start < 0 ? 0 : start;
    for (; k < n; k++) {
        PyObject *kind = PyList_GET_ITEM(kinds, k);
        long kind_value = PyLong_AsLong(kind);
        if (kind_value == -1 && PyErr_Occurred()) goto fail;
        if (kind_value != data_kind) continue; /* the dispatcher skips what is not DATA */
        PyObject *payload = PyList_GET_ITEM(payloads, k);
        Record r;
        if (!read_plain(payload, &r)) break;
        if (equals_any(r.topic, r.topic_length, special_topics)) break;
        const unsigned char *topic = r.topic;
        Py_ssize_t topic_length = r.topic_length;
        long queue_id = r.queue_id;
        int64_t queue_offset = r.queue_offset;
        int64_t physical_offset = r.physical_offset;
        int32_t size = r.size, sys_flag = r.sys_flag;
        int64_t stored_at;
        if (positions == Py_None) break; /* not read yet: the caller reads them for this one */
        if (position_at(positions, k, header_bytes, &stored_at) < 0) goto fail;
        if (stored_at < 0 || physical_offset != stored_at) break;
        int64_t store_timestamp = r.store_timestamp;

        Found tags = {0}, keys = {0}, uniq = {0};
        const unsigned char *p = r.properties, *end = p + r.properties_length;
        int stop = 0;
        while (p <= end && !stop) { /* pairs as bytes.split(b"\x02") gives them */
            const unsigned char *sep = memchr(p, 2, (size_t)(end - p));
            const unsigned char *pair_end = sep ? sep : end;
            const unsigned char *eq = memchr(p, 1, (size_t)(pair_end - p));
            if (eq != NULL) {
                Py_ssize_t key_length = eq - p;
                Found value = {eq + 1, pair_end - eq - 1, 1};
                if (key_is(p, key_length, "TAGS"))
                    tags = value;
                else if (key_is(p, key_length, "KEYS"))
                    keys = value;
                else if (key_is(p, key_length, "UNIQ_KEY"))
                    uniq = value;
                if (equals_any(p, key_length, stop_keys)) stop = 1;
            }
            if (sep == NULL) break;
            p = sep + 1;
        }
        if (stop) break;
        int64_t tag_hash = 0;
        if (tags.present && tags.length > 0) {
            if (!is_ascii(tags.value, tags.length)) break;
            tag_hash = (int64_t)(int32_t)java_hash(0, tags.value, tags.length);
        }
        Py_ssize_t item_count = 0;
        if ((sys_flag & TRANSACTION_TYPE_MASK) != TRANSACTION_ROLLBACK) {
            item_count = key_hashes(topic, topic_length, &uniq, &keys, hashes, items_max);
            if (item_count < 0) break;
        }

        /* plain: its unit joins its queue's run, its items the list */
        Run *run = NULL;
        for (Py_ssize_t i = 0; i < out.count; i++) {
            Run *r = &out.runs[i];
            if (r->queue_id == queue_id && r->topic_length == topic_length &&
                memcmp(r->topic, topic, (size_t)topic_length) == 0) {
                run = r;
                break;
            }
        }
        if (run != NULL && run->next_offset != queue_offset) break;
        if (run == NULL) {
            if (grow((void **)&out.runs, &out.capacity, out.count + 1, sizeof(Run)) < 0) goto fail;
            run = &out.runs[out.count++];
            memset(run, 0, sizeof(Run));
            run->topic = topic;
            run->topic_length = topic_length;
            run->queue_id = queue_id;
            run->first_offset = run->next_offset = queue_offset;
        }
        if (grow((void **)&run->units, &run->capacity, (run->count + 1) * UNIT_BYTES, 1) < 0)
            goto fail;
        unsigned char *unit = run->units + run->count * UNIT_BYTES;
        put_be64(unit, (uint64_t)physical_offset);
        put_be32(unit + 8, (uint32_t)size);
        put_be64(unit + 12, (uint64_t)tag_hash);
        run->count++;
        run->next_offset++;
        if (item_count > 0) {
            if (grow((void **)&out.items, &out.item_capacity, out.item_count + item_count,
                     sizeof(Item)) < 0)
                goto fail;
            for (Py_ssize_t i = 0; i < item_count; i++) {
                Item *item = &out.items[out.item_count++];
                item->key_hash = hashes[i];
                item->count = i == 0 ? (uint32_t)item_count : 0;
                item->physical_offset = physical_offset;
                item->store_timestamp = store_timestamp;
            }
        }
    }
    {
        PyObject *runs = PyList_New(out.count);
        if (runs == NULL) goto fail;
        for (Py_ssize_t i = 0; i < out.count; i++) {
            Run *r = &out.runs[i];
            PyObject *run = Py_BuildValue(
                "(s#lLy#)", (const char *)r->topic, r->topic_length, r->queue_id,
                (long long)r->first_offset, (const char *)r->units, r->count * UNIT_BYTES);
            if (run == NULL) {
                Py_DECREF(runs);
                goto fail;
            }
            PyList_SET_ITEM(runs, i, run);
        }
        PyObject *result = Py_BuildValue("(nNy#)", k, runs,
                                         out.items ? (const char *)out.items : "",
                                         out.item_count * (Py_ssize_t)sizeof(Item));
        scan_out_free(&out);
        return result;
    }
fail:
    scan_out_free(&out);
    return NULL;
}

static PyObject *index_put(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer mm, items;
    Py_ssize_t at;
    long long slot_count, item_count, index_count, hash_slot_count;
    long long begin_ms, begin_phy, end_ms, end_phy;
    if (!PyArg_ParseTuple(args, "w*y*nLLLLLLLL", &mm, &items, &at, &slot_count, &item_count,
                          &index_count, &hash_slot_count, &begin_ms, &begin_phy, &end_ms,
                          &end_phy))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t total = items.len / (Py_ssize_t)sizeof(Item);
    int64_t items_at = INDEX_HEADER_BYTES + slot_count * INDEX_SLOT_BYTES;
    if (slot_count < 1 || item_count < 2 || items.len % (Py_ssize_t)sizeof(Item) != 0 ||
        items_at + item_count * INDEX_ITEM_BYTES > mm.len || at < 0 || index_count < 1) {
        PyErr_SetString(PyExc_ValueError, "index_put: geometry, items or file do not agree");
        goto done;
    }
    const Item *all = (const Item *)items.buf;
    unsigned char *base = (unsigned char *)mm.buf;
    while (at < total) {
        const Item *first = &all[at];
        Py_ssize_t count = first->count;
        if (count < 1 || at + count > total) {
            PyErr_SetString(PyExc_ValueError, "index_put: not at a message's first item");
            goto done;
        }
        if (first->physical_offset <= end_phy) { /* indexed already: a replay */
            at += count;
            continue;
        }
        if (item_count - index_count < count) break; /* the caller rolls a new file */
        for (Py_ssize_t i = 0; i < count; i++) {
            const Item *item = &all[at + i];
            long long number = index_count;
            unsigned char *slot = base + INDEX_HEADER_BYTES +
                                  (int64_t)(item->key_hash % (uint64_t)slot_count) *
                                      INDEX_SLOT_BYTES;
            int32_t prev = (int32_t)be32(slot);
            if (prev <= 0 || prev > number) {
                prev = 0;
                hash_slot_count++;
            }
            if (number == 1) {
                begin_ms = item->store_timestamp;
                begin_phy = item->physical_offset;
            }
            long long time_diff = 0;
            if (begin_ms > 0) {
                long long elapsed;
                if (__builtin_sub_overflow((long long)item->store_timestamp, begin_ms,
                                           &elapsed))
                    time_diff = item->store_timestamp < begin_ms ? -1 : TIME_DIFF_MAX;
                else /* floor division as Python's //: only the sign of a negative matters */
                    time_diff = elapsed >= 0 ? elapsed / 1000 : -1;
            }
            if (time_diff < 0) time_diff = 0;
            if (time_diff > TIME_DIFF_MAX) time_diff = TIME_DIFF_MAX;
            unsigned char *out = base + items_at + number * INDEX_ITEM_BYTES;
            put_be32(out, item->key_hash);
            put_be64(out + 4, (uint64_t)item->physical_offset);
            put_be32(out + 12, (uint32_t)time_diff);
            put_be32(out + 16, (uint32_t)prev);
            put_be32(slot, (uint32_t)number);
            index_count = number + 1;
            end_phy = item->physical_offset;
            end_ms = item->store_timestamp;
        }
        at += count;
    }
    result = Py_BuildValue("(nLLLLLL)", at, index_count, hash_slot_count, begin_ms, begin_phy,
                           end_ms, end_phy);
done:
    PyBuffer_Release(&mm);
    PyBuffer_Release(&items);
    return result;
}

static int contains_any(const unsigned char *data, Py_ssize_t length, PyObject *needles) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(needles); i++) {
        PyObject *needle = PyTuple_GET_ITEM(needles, i);
        if (PyBytes_Check(needle) &&
            memmem(data, (size_t)length, PyBytes_AS_STRING(needle),
                   (size_t)PyBytes_GET_SIZE(needle)) != NULL)
            return 1;
    }
    return 0;
}

/* The queue key (topic, queue_id) of the record shaped last: a batch's messages mostly share
 * one, so it is made once, not per message. */
typedef struct {
    PyObject *key; /* owned, or NULL */
    const unsigned char *topic;
    Py_ssize_t topic_length;
    long queue_id;
} LastKey;

static PyObject *queue_key(LastKey *last, const Record *r) {
    if (last->key != NULL && last->queue_id == r->queue_id &&
        last->topic_length == r->topic_length &&
        memcmp(last->topic, r->topic, (size_t)r->topic_length) == 0)
        return last->key;
    PyObject *topic = PyUnicode_DecodeASCII((const char *)r->topic, r->topic_length, NULL);
    if (topic == NULL) return NULL;
    PyObject *queue_id = PyLong_FromLong(r->queue_id);
    if (queue_id == NULL) {
        Py_DECREF(topic);
        return NULL;
    }
    PyObject *key = PyTuple_New(2);
    if (key == NULL) {
        Py_DECREF(topic);
        Py_DECREF(queue_id);
        return NULL;
    }
    PyTuple_SET_ITEM(key, 0, topic);
    PyTuple_SET_ITEM(key, 1, queue_id);
    Py_XSETREF(last->key, key);
    last->topic = r->topic;
    last->topic_length = r->topic_length;
    last->queue_id = r->queue_id;
    return key;
}

/* A new tuple of `type` (a tuple subclass such as Placed) holding `items` (references
 * stolen, all non-NULL), or NULL: what tuple.__new__(type, items) makes. */
static PyObject *tuple_of(PyTypeObject *type, Py_ssize_t count, PyObject **items) {
    PyObject *tuple = type == &PyTuple_Type ? PyTuple_New(count) : type->tp_alloc(type, count);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (tuple == NULL || items[i] == NULL) {
            for (Py_ssize_t j = i; j < count; j++) Py_XDECREF(items[j]);
            Py_XDECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, i, items[i]);
    }
    return tuple;
}

/* One plain message shaped: its record with both offsets written, next_offsets advanced, its
 * queue key and (index, Placed) appended. 1 done, 0 not plain or offset unknown, -1 error. */
static int shape_one(PyObject *payload, int64_t physical_offset, long long index,
                     PyObject *next_offsets, PyObject *stop_keys, PyTypeObject *placed_type,
                     LastKey *last, PyObject *shaped, PyObject *keys, PyObject *placed) {
    Record r;
    if (!read_plain(payload, &r) || contains_any(r.properties, r.properties_length, stop_keys))
        return 0;
    PyObject *key = queue_key(last, &r); /* borrowed from `last` */
    if (key == NULL) return -1;
    PyObject *offset_object = PyDict_GetItemWithError(next_offsets, key); /* borrowed */
    if (offset_object == NULL) return PyErr_Occurred() ? -1 : 0; /* the caller asks the queue */
    long long offset = PyLong_AsLongLong(offset_object);
    if (offset == -1 && PyErr_Occurred()) return -1;
    PyObject *next = PyLong_FromLongLong(offset + 1);
    if (next == NULL) return -1;
    int set = PyDict_SetItem(next_offsets, key, next);
    Py_DECREF(next);
    if (set < 0) return -1;
    PyObject *record = PyBytes_FromStringAndSize(PyBytes_AS_STRING(payload), r.size);
    if (record == NULL) return -1;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(record);
    put_be64(out + 20, (uint64_t)offset);
    put_be64(out + 28, (uint64_t)physical_offset);
    PyObject *fields[3] = {PyLong_FromLong(r.queue_id), PyLong_FromLongLong(offset),
                           PyLong_FromLongLong(physical_offset)};
    PyObject *pair[2] = {PyLong_FromLongLong(index), tuple_of(placed_type, 3, fields)};
    PyObject *where = tuple_of(&PyTuple_Type, 2, pair);
    int done = -1;
    if (where != NULL && PyList_Append(keys, key) == 0 && PyList_Append(placed, where) == 0 &&
        PyList_Append(shaped, record) == 0)
        done = 1;
    Py_XDECREF(where);
    Py_DECREF(record);
    return done;
}

static PyObject *shape(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *payloads, *positions, *next_offsets, *stop_keys, *placed_type;
    PyObject *shaped, *keys, *placed;
    Py_ssize_t start;
    long long first_index, header_bytes;
    if (!PyArg_ParseTuple(args, "O!O!nLLO!O!O!O!O!O!", &PyList_Type, &payloads, &PyList_Type,
                          &positions, &start, &first_index, &header_bytes, &PyDict_Type,
                          &next_offsets, &PyTuple_Type, &stop_keys, &PyType_Type, &placed_type,
                          &PyList_Type, &shaped, &PyList_Type, &keys, &PyList_Type, &placed))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)placed_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "placed_type must be a tuple subclass");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(payloads);
    Py_ssize_t k = start < 0 ? 0 : start;
    LastKey last = {0};
    for (; k < n; k++) {
        int64_t physical_offset;
        if (position_at(positions, k, header_bytes, &physical_offset) < 0) break;
        int done = shape_one(PyList_GET_ITEM(payloads, k), physical_offset, first_index + k,
                             next_offsets, stop_keys, (PyTypeObject *)placed_type, &last, shaped,
                             keys, placed);
        if (done <= 0) break;
    }
    Py_XDECREF(last.key);
    return PyErr_Occurred() ? NULL : PyLong_FromSsize_t(k);
}

/* crc(body) & 0x7FFFFFFF through the Python `crc` function (isal's crc32, as
 * stored_message.Packer sums bodies); 0 with an error set when the call fails. */
static int body_crc_of(PyObject *crc, const unsigned char *body, Py_ssize_t length,
                       uint32_t *out) {
    PyObject *view = PyMemoryView_FromMemory((char *)body, length, PyBUF_READ);
    if (view == NULL) return 0;
    PyObject *crc_object = PyObject_CallOneArg(crc, view);
    Py_DECREF(view);
    if (crc_object == NULL) return 0;
    unsigned long value = PyLong_AsUnsignedLongMask(crc_object);
    Py_DECREF(crc_object);
    if (value == (unsigned long)-1 && PyErr_Occurred()) return 0;
    *out = (uint32_t)(value & 0x7FFFFFFFu);
    return 1;
}

/* A record's bytes after its 88 fixed ones, at `p`: the body, the topic part (length and
 * topic), the properties' int16 length, the properties and the CLUSTER pair appended. */
static void put_record_tail(unsigned char *p, const unsigned char *body, Py_ssize_t body_length,
                            const Py_buffer *topic_part, const unsigned char *properties,
                            Py_ssize_t properties_length, const Py_buffer *cluster_pair) {
    memcpy(p, body, (size_t)body_length);
    p += body_length;
    memcpy(p, topic_part->buf, (size_t)topic_part->len);
    p += topic_part->len;
    Py_ssize_t stored_length = properties_length + cluster_pair->len;
    p[0] = (unsigned char)(stored_length >> 8);
    p[1] = (unsigned char)stored_length;
    memcpy(p + 2, properties, (size_t)properties_length);
    memcpy(p + 2 + properties_length, cluster_pair->buf, (size_t)cluster_pair->len);
}

/* pack_batch: the records of a batch send whose messages are all plain, or None. */
static PyObject *pack_batch(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer body, head, topic_part, cluster_pair;
    PyObject *markers, *crc;
    Py_ssize_t record_max, properties_max, messages_max;
    if (!PyArg_ParseTuple(args, "y*y*y*y*O!nnnO", &body, &head, &topic_part, &cluster_pair,
                          &PyTuple_Type, &markers, &record_max, &properties_max, &messages_max,
                          &crc))
        return NULL;
    PyObject *records = NULL, *first_properties = NULL, *result = NULL;
    const unsigned char *b = body.buf;
    Py_ssize_t length = body.len, at = 0, count = 0;
    if (head.len != FIXED_V4 || !PyCallable_Check(crc)) {
        PyErr_SetString(PyExc_ValueError, "pack_batch: a head of 88 bytes and a crc function");
        goto done;
    }
    records = PyList_New(0);
    if (records == NULL) goto done;
    while (at < length) { /* the checks of send.parse_batch; anything it refuses: None */
        if (length - at < 20) goto python;
        int32_t total = (int32_t)be32(b + at), flag = (int32_t)be32(b + at + 12);
        int32_t body_length = (int32_t)be32(b + at + 16);
        if (total < 22 || body_length < 0 || total > length - at) goto python;
        Py_ssize_t end = at + total, props_at = at + 20 + body_length;
        if (props_at + 2 > end) goto python;
        int16_t props_length = (int16_t)((b[props_at] << 8) | b[props_at + 1]);
        if (props_length < 0 || props_at + 2 + props_length != end) goto python;
        if (++count > messages_max) goto python;
        const unsigned char *properties = b + props_at + 2;
        if (contains_any(properties, props_length, markers)) goto python; /* not plain */
        Py_ssize_t properties_length = props_length + cluster_pair.len;
        Py_ssize_t size = FIXED_V4 + body_length + topic_part.len + 2 + properties_length;
        if (properties_length > properties_max || size > record_max) goto python;
        if (first_properties == NULL) {
            first_properties = PyBytes_FromStringAndSize((const char *)properties, props_length);
            if (first_properties == NULL) goto done;
        }
        uint32_t body_crc;
        if (!body_crc_of(crc, b + at + 20, body_length, &body_crc)) goto done;
        PyObject *record = PyBytes_FromStringAndSize(NULL, size);
        if (record == NULL) goto done;
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(record);
        memcpy(out, head.buf, FIXED_V4);
        put_be32(out, (uint32_t)size);
        put_be32(out + 8, body_crc);
        put_be32(out + 16, (uint32_t)flag);
        put_be32(out + 84, (uint32_t)body_length);
        put_record_tail(out + FIXED_V4, b + at + 20, body_length, &topic_part, properties,
                        props_length, &cluster_pair);
        int appended = PyList_Append(records, record);
        Py_DECREF(record);
        if (appended < 0) goto done;
        at = end;
    }
    if (count == 0) goto python;
    result = PyTuple_Pack(2, records, first_properties);
    goto done;
python:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(records);
    Py_XDECREF(first_properties);
    PyBuffer_Release(&body);
    PyBuffer_Release(&head);
    PyBuffer_Release(&topic_part);
    PyBuffer_Release(&cluster_pair);
    return result;
}

/* The kinds of SendMessageRequestHeader's fields, in declaration order (remoting/headers.py). */
enum { TEXT_REQUIRED, INT_REQUIRED, TEXT_OPTIONAL, INT_OPTIONAL, BOOL_OPTIONAL, BATCH_OPTIONAL };
static const int SEND_FIELD_KINDS[13] = {
    TEXT_REQUIRED, TEXT_REQUIRED, TEXT_REQUIRED, INT_REQUIRED, INT_REQUIRED, INT_REQUIRED,
    INT_REQUIRED, INT_REQUIRED, TEXT_OPTIONAL, INT_OPTIONAL, BOOL_OPTIONAL, INT_OPTIONAL,
    BATCH_OPTIONAL};

/* An int field as the generated decoder's quick path reads one: 1-18 ASCII digits. */
static int digits_value(PyObject *raw, long long *value) {
    if (!PyUnicode_CheckExact(raw) || !PyUnicode_IS_ASCII(raw)) return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(raw);
    const char *p = (const char *)PyUnicode_DATA(raw);
    if (n < 1 || n > 18) return 0;
    long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        v = v * 10 + (p[i] - '0');
    }
    *value = v;
    return 1;
}

/* A plain single send's 13 header fields read from extFields `ext` by their wire `names`:
 * `raw` (borrowed, NULL where absent) and the numbers in `ints`. 1 when every field has the
 * form a client writes, 0 when not (the Python decoder reads it), -1 with an error set. */
static int read_send_fields(PyObject *ext, PyObject *names, PyObject **raw, long long *ints) {
    for (int k = 0; k < 13; k++) {
        raw[k] = PyDict_GetItemWithError(ext, PyTuple_GET_ITEM(names, k)); /* borrowed */
        if (raw[k] == NULL && PyErr_Occurred()) return -1;
        PyObject *v = raw[k];
        switch (SEND_FIELD_KINDS[k]) {
        case TEXT_REQUIRED:
            if (v == NULL || !PyUnicode_CheckExact(v)) return 0;
            break;
        case TEXT_OPTIONAL:
            if (v != NULL && !PyUnicode_CheckExact(v)) return 0;
            break;
        case INT_REQUIRED:
            if (v == NULL || !digits_value(v, &ints[k])) return 0;
            break;
        case INT_OPTIONAL:
            if (v != NULL && !digits_value(v, &ints[k])) return 0;
            break;
        case BOOL_OPTIONAL:
            if (v != NULL && !(PyUnicode_CheckExact(v) &&
                               (PyUnicode_CompareWithASCIIString(v, "true") == 0 ||
                                PyUnicode_CompareWithASCIIString(v, "false") == 0)))
                return 0;
            break;
        case BATCH_OPTIONAL: /* a batch is packed by pack_batch */
            if (v != NULL && !(PyUnicode_CheckExact(v) &&
                               PyUnicode_CompareWithASCIIString(v, "false") == 0))
                return 0;
            break;
        }
    }
    return 1;
}

/* The V1 record of one plain message with IPv4 hosts (8 bytes each: address and port), or
 * None (a new reference) when its properties hold a marker or it is over a bound: the Python
 * path then makes or refuses it. NULL with an error set. */
static PyObject *plain_record(const Py_buffer *body, int flag, const Py_buffer *properties,
                              const Py_buffer *cluster_pair, PyObject *markers,
                              const Py_buffer *topic_part, int queue_id, int sys_flag,
                              long long born_ms, const unsigned char *born_host,
                              long long store_ms, const unsigned char *store_host,
                              int reconsume_times, Py_ssize_t record_max,
                              Py_ssize_t properties_max, PyObject *crc) {
    const unsigned char *props = properties->buf;
    if (contains_any(props, properties->len, markers)) Py_RETURN_NONE; /* not plain */
    Py_ssize_t properties_length = properties->len + cluster_pair->len;
    Py_ssize_t size = FIXED_V4 + body->len + topic_part->len + 2 + properties_length;
    if (properties_length > properties_max || size > record_max) Py_RETURN_NONE;
    uint32_t body_crc;
    if (!body_crc_of(crc, body->buf, body->len, &body_crc)) return NULL;
    PyObject *result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL) return NULL;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    put_be32(out, (uint32_t)size);
    put_be32(out + 4, MAGIC_V1);
    put_be32(out + 8, body_crc);
    put_be32(out + 12, (uint32_t)queue_id);
    put_be32(out + 16, (uint32_t)flag);
    put_be64(out + 20, 0); /* queue offset and physical offset: the leader writes them */
    put_be64(out + 28, 0);
    put_be32(out + 36, (uint32_t)sys_flag);
    put_be64(out + 40, (uint64_t)born_ms);
    memcpy(out + 48, born_host, 8);
    put_be64(out + 56, (uint64_t)store_ms);
    memcpy(out + 64, store_host, 8);
    put_be32(out + 72, (uint32_t)reconsume_times);
    put_be64(out + 76, 0); /* prepared transaction offset */
    put_be32(out + 84, (uint32_t)body->len);
    put_record_tail(out + FIXED_V4, body->buf, body->len, topic_part, props, properties->len,
                    cluster_pair);
    return result;
}

/* What prepare_plains holds for a whole batch of requests. */
typedef struct {
    PyObject *names_v1, *names_v2, *topics, *topic_part_of, *markers, *crc, *prepared_type;
    long code_v1, code_v2, perm_write, transaction_bits, prepared_value;
    Py_buffer born_host, store_host, cluster_pair;
    long long now_ms;
    Py_ssize_t record_max, properties_max;
} PlainBatch;

/* An int attribute of `object` (a TopicConfig's perm or write_queues); 0 with an error set. */
static int int_attribute(PyObject *object, const char *name, long *out) {
    PyObject *value = PyObject_GetAttrString(object, name);
    if (value == NULL) return 0;
    *out = PyLong_AsLong(value);
    Py_DECREF(value);
    return !(*out == -1 && PyErr_Occurred());
}

/* One request of prepare_plains: its _Prepared, None, or NULL with an error set. The checks
 * and their order are broker/send.py _prepare_plain's. */
static PyObject *prepare_plain_one(const PlainBatch *b, PyObject *request) {
    if (!PyTuple_Check(request) || PyTuple_GET_SIZE(request) < 6) Py_RETURN_NONE;
    PyObject *ext = PyTuple_GET_ITEM(request, 4), *body_object = PyTuple_GET_ITEM(request, 5);
    long code = PyLong_Check(PyTuple_GET_ITEM(request, 0))
                    ? PyLong_AsLong(PyTuple_GET_ITEM(request, 0))
                    : -1;
    if (code == -1 && PyErr_Occurred()) PyErr_Clear();
    PyObject *names = code == b->code_v1 ? b->names_v1 : code == b->code_v2 ? b->names_v2 : NULL;
    if (names == NULL || !PyDict_Check(ext) || !PyBytes_CheckExact(body_object)) Py_RETURN_NONE;
    PyObject *raw[13];
    long long ints[13] = {0};
    int read = read_send_fields(ext, names, raw, ints);
    if (read <= 0) return read < 0 ? NULL : Py_NewRef(Py_None);
    /* held: topic_part_of runs Python, which could change the dict they were borrowed from */
    PyObject *topic = Py_NewRef(raw[1]), *properties = Py_XNewRef(raw[8]);
    long long queue_id = ints[4], sys_flag = ints[5], born_ms = ints[6], flag = ints[7];
    long long reconsume_times = ints[9];
    PyObject *result = NULL, *properties_data = NULL;
    PyObject *topic_part = PyObject_CallOneArg(b->topic_part_of, topic);
    if (topic_part == NULL) goto done;
    long perm, write_queues;
    PyObject *config = PyDict_GetItemWithError(b->topics, topic); /* borrowed */
    if (config == NULL && PyErr_Occurred()) goto done;
    if (topic_part == Py_None || !PyBytes_Check(topic_part) || config == NULL) goto python;
    if (!int_attribute(config, "perm", &perm) ||
        !int_attribute(config, "write_queues", &write_queues))
        goto done;
    long long largest = flag > sys_flag ? flag : sys_flag;
    if (reconsume_times > largest) largest = reconsume_times;
    if (!(perm & b->perm_write) || queue_id >= write_queues ||
        (sys_flag & b->transaction_bits) == b->prepared_value || largest > INT32_MAX)
        goto python;
    if (properties == NULL || PyUnicode_GET_LENGTH(properties) == 0) {
        properties_data = PyBytes_FromStringAndSize(NULL, 0);
    } else {
        properties_data = PyUnicode_AsUTF8String(properties);
        if (properties_data == NULL && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
            PyErr_Clear(); /* lone surrogates: the other path says what it does with them */
            goto python;
        }
    }
    if (properties_data == NULL) goto done;
    Py_buffer body = {.buf = PyBytes_AS_STRING(body_object), .len = PyBytes_GET_SIZE(body_object)};
    Py_buffer props = {.buf = PyBytes_AS_STRING(properties_data),
                       .len = PyBytes_GET_SIZE(properties_data)};
    Py_buffer part = {.buf = PyBytes_AS_STRING(topic_part), .len = PyBytes_GET_SIZE(topic_part)};
    PyObject *record = plain_record(
        &body, (int)flag, &props, &b->cluster_pair, b->markers, &part, (int)queue_id,
        (int)(sys_flag & ~0x30LL), born_ms, b->born_host.buf, b->now_ms, b->store_host.buf,
        (int)reconsume_times, b->record_max, b->properties_max, b->crc);
    if (record == NULL) goto done;
    if (record == Py_None) {
        result = record;
        goto done;
    }
    PyObject *items[6] = {Py_NewRef(request), Py_NewRef(properties_data), PyList_New(0),
                          PyList_New(1), PyLong_FromLongLong(queue_id), PyLong_FromLong(0)};
    if (items[3] != NULL)
        PyList_SET_ITEM(items[3], 0, record);
    else
        Py_DECREF(record);
    result = tuple_of((PyTypeObject *)b->prepared_type, 6, items);
    goto done;
python:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(topic_part);
    Py_XDECREF(properties_data);
    Py_DECREF(topic);
    Py_XDECREF(properties);
    return result;
}

/* prepare_plains: for each send request read in one go, the _Prepared of its one plain
 * message (what broker/send.py _prepare_plain made of it one call at a time), or None where
 * the Python path must look. */
static PyObject *prepare_plains(PyObject *Py_UNUSED(self), PyObject *args) {
    PlainBatch b;
    PyObject *requests;
    if (!PyArg_ParseTuple(args, "O!O!O!llO!OO!y*y*y*LnnlllOO", &PyList_Type, &requests,
                          &PyTuple_Type, &b.names_v1, &PyTuple_Type, &b.names_v2, &b.code_v1,
                          &b.code_v2, &PyDict_Type, &b.topics, &b.topic_part_of, &PyTuple_Type,
                          &b.markers, &b.born_host, &b.store_host, &b.cluster_pair, &b.now_ms,
                          &b.record_max, &b.properties_max, &b.perm_write, &b.transaction_bits,
                          &b.prepared_value, &b.crc, &b.prepared_type))
        return NULL;
    PyObject *out = NULL;
    if (b.born_host.len != 8 || b.store_host.len != 8 || !PyCallable_Check(b.crc) ||
        !PyCallable_Check(b.topic_part_of) || PyTuple_GET_SIZE(b.names_v1) != 13 ||
        PyTuple_GET_SIZE(b.names_v2) != 13 || !PyType_Check(b.prepared_type) ||
        !PyType_IsSubtype((PyTypeObject *)b.prepared_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_ValueError,
                        "prepare_plains: hosts of 8 bytes, 13 wire names, callables and a "
                        "tuple type");
        goto done;
    }
    Py_ssize_t count = PyList_GET_SIZE(requests);
    out = PyList_New(count);
    for (Py_ssize_t k = 0; out != NULL && k < count; k++) {
        PyObject *made = prepare_plain_one(&b, PyList_GET_ITEM(requests, k));
        if (made == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, k, made);
    }
done:
    PyBuffer_Release(&b.born_host);
    PyBuffer_Release(&b.store_host);
    PyBuffer_Release(&b.cluster_pair);
    return out;
}

/* _Prepared (broker/send.py) and RemotingCommand (remoting/command.py) are NamedTuples:
 * fields by position, checked by the Python side at import */
enum { PREPARED_REQUEST = 0, PREPARED_RECORDS = 3, PREPARED_QUEUE_ID = 4, PREPARED_HALVES = 5,
       PREPARED_FIELDS = 6 };
enum { COMMAND_OPAQUE = 1, COMMAND_SERIALIZATION = 8, COMMAND_FIELDS = 9 };
enum { SEND_OK_PARTS = 5, SEND_OK_NUMBER_MAX = 24 };

/* A tuple item as a long long; -1 with an error set when it is not an int. */
static int tuple_int(PyObject *tuple, Py_ssize_t at, long long *out) {
    *out = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, at));
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* One SEND_OK frame; NULL with an error set. */
static PyObject *send_ok_frame(PyObject *const *parts, long long opaque, long long physical,
                               long long queue_id, long long queue_offset) {
    char numbers[4][SEND_OK_NUMBER_MAX];
    int lengths[4];
    lengths[0] = snprintf(numbers[0], SEND_OK_NUMBER_MAX, "%lld", opaque);
    lengths[1] = snprintf(numbers[1], SEND_OK_NUMBER_MAX, "%016llX", (unsigned long long)physical);
    lengths[2] = snprintf(numbers[2], SEND_OK_NUMBER_MAX, "%lld", queue_id);
    lengths[3] = snprintf(numbers[3], SEND_OK_NUMBER_MAX, "%lld", queue_offset);
    Py_ssize_t header = 0;
    for (int k = 0; k < SEND_OK_PARTS; k++) header += PyBytes_GET_SIZE(parts[k]);
    for (int k = 0; k < 4; k++) header += lengths[k];
    if (header > 0xFFFFFF) {
        PyErr_SetString(PyExc_ValueError, "a SEND_OK header over 16 MiB");
        return NULL;
    }
    PyObject *frame = PyBytes_FromStringAndSize(NULL, 8 + header);
    if (frame == NULL) return NULL;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(frame);
    uint32_t length = (uint32_t)(4 + header), mark = (uint32_t)header; /* JSON: type byte 0 */
    for (int k = 0; k < 4; k++) {
        out[k] = (unsigned char)(length >> (24 - 8 * k));
        out[4 + k] = (unsigned char)(mark >> (24 - 8 * k));
    }
    out += 8;
    for (int k = 0; k < SEND_OK_PARTS; k++) {
        memcpy(out, PyBytes_AS_STRING(parts[k]), (size_t)PyBytes_GET_SIZE(parts[k]));
        out += PyBytes_GET_SIZE(parts[k]);
        if (k < 4) {
            memcpy(out, numbers[k], (size_t)lengths[k]);
            out += lengths[k];
        }
    }
    return frame;
}

static PyObject *send_ok_frames(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *answering, *placed, *parts_tuple, *json, *responses;
    long long first;
    if (!PyArg_ParseTuple(args, "O!O!LO!OO!:send_ok_frames", &PyList_Type, &answering,
                          &PyList_Type, &placed, &first, &PyTuple_Type, &parts_tuple, &json,
                          &PyList_Type, &responses))
        return NULL;
    if (PyTuple_GET_SIZE(parts_tuple) != SEND_OK_PARTS) {
        PyErr_SetString(PyExc_ValueError, "parts: the header's five pieces");
        return NULL;
    }
    PyObject *const *parts = &PyTuple_GET_ITEM(parts_tuple, 0);
    for (int k = 0; k < SEND_OK_PARTS; k++) {
        if (!PyBytes_Check(parts[k])) {
            PyErr_SetString(PyExc_TypeError, "parts: bytes");
            return NULL;
        }
    }
    PyObject *rest = PyList_New(0);
    if (rest == NULL) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(answering);
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *item = PyList_GET_ITEM(answering, k), *pair, *prepared, *request, *records;
        long long slot, index, halves, opaque, queue_id, queue_offset, physical;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
            !PyTuple_Check(pair = PyTuple_GET_ITEM(item, 0)) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyTuple_Check(prepared = PyTuple_GET_ITEM(pair, 1)) ||
            PyTuple_GET_SIZE(prepared) != PREPARED_FIELDS ||
            !PyTuple_Check(request = PyTuple_GET_ITEM(prepared, PREPARED_REQUEST)) ||
            PyTuple_GET_SIZE(request) != COMMAND_FIELDS ||
            !PyList_Check(records = PyTuple_GET_ITEM(prepared, PREPARED_RECORDS))) {
            PyErr_SetString(PyExc_TypeError, "answering: ((slot, _Prepared), index) items");
            goto fail;
        }
        if (tuple_int(pair, 0, &slot) < 0 || tuple_int(item, 1, &index) < 0 ||
            tuple_int(prepared, PREPARED_HALVES, &halves) < 0)
            goto fail;
        if (PyList_GET_SIZE(records) != 1 || halves != 0 ||
            PyTuple_GET_ITEM(request, COMMAND_SERIALIZATION) != json) {
            if (PyList_Append(rest, item) < 0) goto fail;
            continue;
        }
        if (index - first < 0 || index - first >= PyList_GET_SIZE(placed) || slot < 0 ||
            slot >= PyList_GET_SIZE(responses)) {
            PyErr_SetString(PyExc_IndexError, "an index outside placed, or a slot outside responses");
            goto fail;
        }
        PyObject *where = PyList_GET_ITEM(placed, (Py_ssize_t)(index - first));
        if (!PyTuple_Check(where) || PyTuple_GET_SIZE(where) != 3) {
            PyErr_SetString(PyExc_TypeError, "placed: Placed tuples");
            goto fail;
        }
        if (tuple_int(request, COMMAND_OPAQUE, &opaque) < 0 ||
            tuple_int(prepared, PREPARED_QUEUE_ID, &queue_id) < 0 ||
            tuple_int(where, 1, &queue_offset) < 0 || tuple_int(where, 2, &physical) < 0)
            goto fail;
        if (physical < 0) {
            PyErr_SetString(PyExc_ValueError, "a negative physical offset");
            goto fail;
        }
        PyObject *frame = send_ok_frame(parts, opaque, physical, queue_id, queue_offset);
        if (frame == NULL) goto fail;
        PyObject *old = PyList_GET_ITEM(responses, (Py_ssize_t)slot);
        PyList_SET_ITEM(responses, (Py_ssize_t)slot, frame);
        Py_XDECREF(old);
    }
    return rest;
fail:
    Py_DECREF(rest);
    return NULL;
}

static PyMethodDef methods[] = {
    {"send_ok_frames", send_ok_frames, METH_VARARGS,
     "The leader's SEND_OK frames of a committed run into `responses`; the other items."},
    {"scan", scan, METH_VARARGS, "The plain messages of an applied batch, from `start` on."},
    {"index_put", index_put, METH_VARARGS, "Put whole messages' items into a mapped IndexFile."},
    {"shape", shape, METH_VARARGS, "The leader's offsets written into plain records from `start` on."},
    {"pack_batch", pack_batch, METH_VARARGS, "The records of a batch of plain messages, or None."},
    {"prepare_plains", prepare_plains, METH_VARARGS,
     "For each send request, the _Prepared of its one plain message, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "broker._dispatch_native",
    "The dispatcher's per-message loop in C (see broker/dispatch_native.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__dispatch_native(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "ITEM_BYTES", (long)sizeof(Item)) < 0 ||
        PyModule_AddIntConstant(m, "UNIT_BYTES", UNIT_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
