/*
 * snowfence_client: reserve N IDs from a snowfence server and print them,
 * one decimal ID per line.
 *
 *     snowfence_client ENDPOINT N          e.g.  snowfence_client tcp://127.0.0.1:5555 10000
 *     snowfence_client ENDPOINT --nodes    prints the NODES reply: the cluster's live nodes (JSON)
 *
 * A minimal client of the wire protocol in docs/PROTOCOL.md (version 1), in
 * C99 with libzmq and libc only. It keeps one RESERVE request in flight on a
 * DEALER socket (a throughput-minded client would pipeline several, matching
 * replies by request id), and follows the doc's client rules:
 *
 *   - every request gets a fresh, increasing request id, and the reply must
 *     echo it;
 *   - a request unanswered within the receive timeout is lost: the socket is
 *     closed and a new one opened before retrying, so a late reply to the old
 *     request can never be taken for the answer to the new one;
 *   - ERROR replies whose "retriable" is true are retried after a short,
 *     doubling back-off; any other error ends the program;
 *   - a BLOCK may grant fewer IDs than asked: the client asks again for the rest.
 *
 * Exit status: 0 when N IDs were printed; 1 on a server error, a protocol
 * violation or when retries are exhausted (the IDs printed until then are
 * valid and unique, just fewer than N); 2 on a usage error.
 */

#define _POSIX_C_SOURCE 200809L /* nanosleep */

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

/* Wire protocol, version 1 (docs/PROTOCOL.md). All integers are big-endian. */
#define PROTO_VERSION 1
#define TYPE_RESERVE 0x01
#define TYPE_NODES 0x04
#define TYPE_NODES_REPLY 0x84
#define TYPE_BLOCK 0x81
#define TYPE_ERROR 0xFF
#define HEADER_SIZE 12  /* version:u8 type:u8 flags:u16 request_id:u64 */
#define RESERVE_SIZE 16 /* header, count:u32 */
#define BLOCK_SIZE 24   /* header, first:u64, count:u32 */
#define MAX_COUNT 4096  /* the most IDs one RESERVE may ask for */

/* Client policy. */
#define RECV_TIMEOUT_MS 2000 /* a request unanswered this long is lost */
#define MAX_ATTEMPTS 5       /* tries of one request (retriable errors and timeouts) */
#define BACKOFF_MS 50        /* first back-off; doubled after each failed try */

static const char *prog = "snowfence_client";

/* -- big-endian encoding ---------------------------------------------------------- */

static void put_u16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 3; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* -- the ERROR reply's JSON object ---------------------------------------------------- */

/*
 * Returns a pointer to the value of the top-level member `key` of the JSON
 * object in `s` (NUL-terminated), or NULL. Not a general JSON parser: it only
 * walks strings (with escapes) and nesting, which is enough to find "code" and
 * "retriable" reliably even when "message" contains quotes or braces.
 */
static const char *json_member(const char *s, const char *key)
{
    size_t klen = strlen(key);
    int depth = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '"') {
            const char *start = ++p;
            while (*p && *p != '"') {
                if (*p == '\\' && p[1])
                    p++;
                p++;
            }
            if (!*p)
                return NULL; /* unterminated string */
            /* A string at depth 1 followed by ':' is a member name. */
            if (depth == 1 && (size_t)(p - start) == klen && memcmp(start, key, klen) == 0) {
                const char *q = p + 1;
                while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
                    q++;
                if (*q == ':') {
                    q++;
                    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
                        q++;
                    return q;
                }
            }
        } else if (*p == '{' || *p == '[') {
            depth++;
        } else if (*p == '}' || *p == ']') {
            depth--;
        }
    }
    return NULL;
}

/* Copies the JSON string value at `v` (pointing at its opening quote) into
 * `out`, escapes left as they are; "?" if `v` is not a string. */
static void json_string(const char *v, char *out, size_t size)
{
    size_t n = 0;
    if (v == NULL || *v != '"') {
        snprintf(out, size, "?");
        return;
    }
    for (v++; *v && *v != '"' && n + 1 < size; v++) {
        if (*v == '\\' && v[1] && n + 2 < size)
            out[n++] = *v++;
        out[n++] = *v;
    }
    out[n] = '\0';
}

/* -- one request ---------------------------------------------------------------------- */

struct client {
    void *ctx;
    void *sock;
    const char *endpoint;
    uint64_t next_request_id; /* fresh and increasing; 0 is never used (errors use it) */
};

static int open_socket(struct client *c)
{
    int linger = 0, timeout = RECV_TIMEOUT_MS;
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (c->sock == NULL || zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &timeout, sizeof timeout) != 0 ||
        zmq_connect(c->sock, c->endpoint) != 0) {
        fprintf(stderr, "%s: cannot connect to %s: %s\n", prog, c->endpoint, zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

static void close_socket(struct client *c)
{
    if (c->sock != NULL)
        zmq_close(c->sock);
    c->sock = NULL;
}

enum outcome {
    GRANTED, /* *first and *count hold a block */
    RETRY,   /* a retriable error or a lost request: try again after a back-off */
    FAILED   /* give up: a non-retriable error or a protocol violation */
};

/* Reads the ERROR body `p` of `size` bytes: reports it; RETRY or FAILED by its flag. */
static enum outcome on_error(const unsigned char *p, size_t size)
{
    char *json = malloc(size - HEADER_SIZE + 1);
    char code[64], message[512];
    if (json == NULL) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return FAILED;
    }
    memcpy(json, p + HEADER_SIZE, size - HEADER_SIZE);
    json[size - HEADER_SIZE] = '\0';
    json_string(json_member(json, "code"), code, sizeof code);
    json_string(json_member(json, "message"), message, sizeof message);
    /* The doc: treat any code, known or not, by its "retriable" flag. */
    const char *retriable = json_member(json, "retriable");
    int retry = retriable != NULL && strncmp(retriable, "true", 4) == 0;
    fprintf(stderr, "%s: server error %s (%s): %s\n", prog, code, retry ? "retriable" : "not retriable", message);
    free(json);
    return retry ? RETRY : FAILED;
}

/* Sends one RESERVE for `want` IDs and reads its reply. */
static enum outcome reserve_once(struct client *c, uint32_t want, uint64_t *first, uint32_t *count)
{
    unsigned char req[RESERVE_SIZE];
    uint64_t request_id = c->next_request_id++;

    req[0] = PROTO_VERSION;
    req[1] = TYPE_RESERVE;
    put_u16(req + 2, 0); /* flags: no AFTER */
    put_u64(req + 4, request_id);
    put_u32(req + 12, want);
    /* A DEALER sends the body frame alone, without an empty delimiter. */
    if (zmq_send(c->sock, req, sizeof req, 0) != (int)sizeof req) {
        fprintf(stderr, "%s: send failed: %s\n", prog, zmq_strerror(zmq_errno()));
        close_socket(c);
        return open_socket(c) == 0 ? RETRY : FAILED;
    }

    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, c->sock, 0) < 0) {
        int err = zmq_errno();
        zmq_msg_close(&msg);
        if (err != EAGAIN) {
            fprintf(stderr, "%s: receive failed: %s\n", prog, zmq_strerror(err));
            return FAILED;
        }
        /* Lost: never reuse this socket, or the late reply could pass for the next one's. */
        fprintf(stderr, "%s: no reply within %d ms; reconnecting\n", prog, RECV_TIMEOUT_MS);
        close_socket(c);
        return open_socket(c) == 0 ? RETRY : FAILED;
    }

    enum outcome result = FAILED;
    const unsigned char *p = zmq_msg_data(&msg);
    size_t size = zmq_msg_size(&msg);
    /* We sent no delimiter, so the reply is exactly one body frame. */
    if (zmq_msg_more(&msg)) {
        fprintf(stderr, "%s: protocol error: reply of more than one frame\n", prog);
    } else if (size < HEADER_SIZE) {
        fprintf(stderr, "%s: protocol error: reply of %zu bytes, shorter than the header\n", prog, size);
    } else if (p[0] != PROTO_VERSION) {
        fprintf(stderr, "%s: protocol error: reply has version %u\n", prog, (unsigned)p[0]);
    } else if (p[1] == TYPE_ERROR) {
        uint64_t echoed = get_u64(p + 4);
        /* 0 means the server could not read the request far enough to know its id. */
        if (echoed != request_id && echoed != 0)
            fprintf(stderr, "%s: protocol error: ERROR for request %" PRIu64 ", expected %" PRIu64 "\n", prog,
                    echoed, request_id);
        else
            result = on_error(p, size);
    } else if (p[1] != TYPE_BLOCK || size != BLOCK_SIZE) {
        fprintf(stderr, "%s: protocol error: unexpected reply type 0x%02x of %zu bytes\n", prog, (unsigned)p[1],
                size);
    } else if (get_u64(p + 4) != request_id) {
        fprintf(stderr, "%s: protocol error: BLOCK for request %" PRIu64 ", expected %" PRIu64 "\n", prog,
                get_u64(p + 4), request_id);
    } else {
        *first = get_u64(p + 12);
        *count = get_u32(p + 20);
        if (*count < 1 || *count > want)
            fprintf(stderr, "%s: protocol error: BLOCK of %" PRIu32 " IDs for a request of %" PRIu32 "\n", prog,
                    *count, want);
        else
            result = GRANTED;
    }
    zmq_msg_close(&msg);
    return result;
}

/* Sends NODES and prints the JSON of its reply; 0 on success. One try: the
 * caller may run it again (a lost reply needs no retry logic here). */
static int nodes_once(struct client *c)
{
    unsigned char req[HEADER_SIZE];
    uint64_t request_id = c->next_request_id++;
    req[0] = PROTO_VERSION;
    req[1] = TYPE_NODES;
    put_u16(req + 2, 0);
    put_u64(req + 4, request_id);
    if (zmq_send(c->sock, req, sizeof req, 0) != (int)sizeof req) {
        fprintf(stderr, "%s: send failed: %s\n", prog, zmq_strerror(zmq_errno()));
        return 1;
    }
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, c->sock, 0) < 0) {
        fprintf(stderr, "%s: no reply to NODES within %d ms\n", prog, RECV_TIMEOUT_MS);
        zmq_msg_close(&msg);
        return 1;
    }
    int status = 1;
    const unsigned char *p = zmq_msg_data(&msg);
    size_t size = zmq_msg_size(&msg);
    if (zmq_msg_more(&msg) || size < HEADER_SIZE || p[0] != PROTO_VERSION || get_u64(p + 4) != request_id) {
        fprintf(stderr, "%s: protocol error: not a reply to NODES request %" PRIu64 "\n", prog, request_id);
    } else if (p[1] == TYPE_ERROR) {
        on_error(p, size);
    } else if (p[1] != TYPE_NODES_REPLY) {
        fprintf(stderr, "%s: protocol error: unexpected reply type 0x%02x to NODES\n", prog, (unsigned)p[1]);
    } else {
        fwrite(p + HEADER_SIZE, 1, size - HEADER_SIZE, stdout);
        putchar('\n');
        status = 0;
    }
    zmq_msg_close(&msg);
    return status;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* -- main -------------------------------------------------------------------------------- */

static int parse_count(const char *s, uint64_t *out)
{
    char *end;
    if (*s < '0' || *s > '9') /* strtoull would accept "-1" and leading spaces */
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = (uint64_t)v;
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t remaining = 0;
    int nodes = argc == 3 && strcmp(argv[2], "--nodes") == 0;
    if (argc != 3 || (!nodes && parse_count(argv[2], &remaining) != 0)) {
        fprintf(stderr,
                "usage: %s ENDPOINT N\n  reserves N IDs and prints one per line\n"
                "       %s ENDPOINT --nodes\n  prints the cluster's live nodes (JSON)\n",
                prog, prog);
        return 2;
    }

    struct client c = {zmq_ctx_new(), NULL, argv[1], 1};
    if (c.ctx == NULL || open_socket(&c) != 0)
        return 1;
    if (nodes) {
        int rc = nodes_once(&c);
        close_socket(&c);
        zmq_ctx_term(c.ctx);
        fflush(stdout);
        return rc;
    }

    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);

    int status = 0, attempts = 0;
    long backoff_ms = BACKOFF_MS;
    while (remaining > 0) {
        uint32_t want = remaining < MAX_COUNT ? (uint32_t)remaining : MAX_COUNT;
        uint64_t first = 0;
        uint32_t count = 0;
        enum outcome r = reserve_once(&c, want, &first, &count);
        if (r == GRANTED) {
            /* IDs first .. first+count-1; count may be less than asked (a partial grant). */
            for (uint32_t i = 0; i < count; i++)
                printf("%" PRIu64 "\n", first + i);
            remaining -= count;
            attempts = 0;
            backoff_ms = BACKOFF_MS;
            continue;
        }
        if (r == FAILED || ++attempts >= MAX_ATTEMPTS) {
            if (r == RETRY)
                fprintf(stderr, "%s: giving up after %d attempts\n", prog, attempts);
            status = 1;
            break;
        }
        sleep_ms(backoff_ms);
        backoff_ms *= 2;
    }

    close_socket(&c);
    zmq_ctx_term(c.ctx);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s: cannot write to stdout\n", prog);
        status = 1;
    }
    return status;
}
