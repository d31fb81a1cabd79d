/*
 * snowfence_client: reserve N IDs from a snowfence server and print them,
 * one decimal ID per line.
 *
 *     snowfence_client ENDPOINT N          e.g.  snowfence_client tcp://127.0.0.1:5555 10000
 *     snowfence_client ENDPOINT --nodes    prints the NODES reply: the cluster's live nodes (JSON)
 *     snowfence_client --driver            the conformance suite's driver protocol on stdin and
 *                                          stdout (tests/conformance/README.md)
 *
 * A minimal client of the wire protocol in docs/PROTOCOL.md (version 1), in
 * C99 with libzmq and libc (POSIX sockets) only. It keeps one RESERVE request
 * in flight (a throughput-minded client would pipeline several, matching
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
 * The fast port: for a tcp:// endpoint the client first asks NODES on a DEALER
 * socket; if the node has a fast port (plain TCP, each body after its length),
 * it sends its RESERVEs there, on the endpoint's host. If that port cannot be
 * reached, or its connection closes, garbles a frame or times out, the request
 * on it is lost and the client uses ZeroMQ for the rest of the run. Set
 * SNOWFENCE_NO_FAST=1 to use ZeroMQ only.
 *
 * Exit status: 0 when N IDs were printed; 1 on a server error, a protocol
 * violation or when retries are exhausted (the IDs printed until then are
 * valid and unique, just fewer than N); 2 on a usage error.
 */

#define _POSIX_C_SOURCE 200809L /* nanosleep, clock_gettime, getaddrinfo, MSG_NOSIGNAL */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

/* Wire protocol, version 1 (docs/PROTOCOL.md). All integers are big-endian. */
#define PROTO_VERSION 1
#define TYPE_RESERVE 0x01
#define TYPE_NODES 0x04
#define TYPE_NODES_REPLY 0x84
#define TYPE_WATERMARK 0x05
#define TYPE_WATERMARK_REPLY 0x85
#define WATERMARK_REPLY_SIZE 28 /* header, unix_ms:u64, lowest:u64 */
#define TYPE_BLOCK 0x81
#define TYPE_ERROR 0xFF
#define HEADER_SIZE 12  /* version:u8 type:u8 flags:u16 request_id:u64 */
#define RESERVE_SIZE 16 /* header, count:u32 */
#define RESERVE_AFTER_SIZE 24 /* header, count:u32, after:u64 (flag AFTER) */
#define FLAG_AFTER 0x0001
#define BLOCK_SIZE 24   /* header, first:u64, count:u32 */
#define MAX_COUNT 4096  /* the most IDs one RESERVE may ask for */
#define MAX_REQUEST 255 /* the largest request body */
#define MAX_REPLY (1 << 20) /* the largest reply body this client reads (NODES of a large cluster: tens of KB) */

/* Client policy. */
#define RECV_TIMEOUT_MS 2000 /* a request unanswered this long is lost */
#define MAX_ATTEMPTS 5       /* tries of one request (retriable errors and timeouts) */
#define BACKOFF_MS 50        /* first back-off; doubled after each failed try */
#define CONNECT_TIMEOUT_MS 1000 /* to connect to the fast port, before using ZeroMQ instead */

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

/* -- the ZeroMQ socket -------------------------------------------------------------------- */

struct client {
    void *ctx;
    void *sock;
    const char *endpoint;
    uint64_t next_request_id; /* fresh and increasing; 0 is never used (errors use it) */
    int fast;                 /* the fast connection's socket, or -1: requests go over ZeroMQ */
    int has_after;            /* whether every RESERVE carries the causal token `after` (flag AFTER) */
    uint64_t after;
};

/* The body of the last reply, whichever way it came (one byte more, for a NUL). */
static unsigned char reply[MAX_REPLY + 1];

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

/* How one request went on the wire. */
enum exchange {
    REPLIED,   /* `reply` holds the reply body */
    LOST,      /* no reply in time, and the socket was replaced: ask again */
    FAST_DOWN, /* the fast connection failed and is closed: ask again on ZeroMQ */
    BROKEN     /* give up: a socket error, or a reply that is not one body */
};

/* Sends the body `req` on the DEALER socket and receives the reply into `reply`. */
static enum exchange zmq_exchange(struct client *c, const unsigned char *req, size_t len, size_t *size)
{
    /* A DEALER sends the body frame alone, without an empty delimiter. */
    if (zmq_send(c->sock, req, len, 0) != (int)len) {
        fprintf(stderr, "%s: send failed: %s\n", prog, zmq_strerror(zmq_errno()));
        close_socket(c);
        return open_socket(c) == 0 ? LOST : BROKEN;
    }
    int n = zmq_recv(c->sock, reply, MAX_REPLY, 0);
    if (n < 0) {
        int err = zmq_errno();
        if (err != EAGAIN) {
            fprintf(stderr, "%s: receive failed: %s\n", prog, zmq_strerror(err));
            return BROKEN;
        }
        /* Lost: never reuse this socket, or the late reply could pass for the next one's. */
        fprintf(stderr, "%s: no reply within %d ms; reconnecting\n", prog, RECV_TIMEOUT_MS);
        close_socket(c);
        return open_socket(c) == 0 ? LOST : BROKEN;
    }
    int more = 0;
    size_t more_size = sizeof more;
    /* We sent no delimiter, so the reply is exactly one body frame. */
    if (zmq_getsockopt(c->sock, ZMQ_RCVMORE, &more, &more_size) != 0 || more) {
        fprintf(stderr, "%s: protocol error: reply of more than one frame\n", prog);
        return BROKEN;
    }
    if (n > MAX_REPLY) { /* zmq_recv truncated it */
        fprintf(stderr, "%s: reply of %d bytes, more than this client reads (%d)\n", prog, n, MAX_REPLY);
        return BROKEN;
    }
    *size = (size_t)n;
    return REPLIED;
}

/* -- the fast port ------------------------------------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sends (POLLOUT) or receives (POLLIN) exactly `n` bytes on the non-blocking socket
 * `fd` before `deadline` (of now_ms()): NULL when done, else what went wrong. */
static const char *fast_io(int fd, short event, unsigned char *p, size_t n, int64_t deadline)
{
    while (n > 0) {
        struct pollfd pfd = {fd, event, 0};
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return "no reply in time";
        int ready = poll(&pfd, 1, (int)left);
        if (ready < 0 && errno != EINTR)
            return strerror(errno);
        if (ready <= 0)
            continue;
        ssize_t done = event == POLLIN ? recv(fd, p, n, 0) : send(fd, p, n, MSG_NOSIGNAL);
        if (done == 0 && event == POLLIN)
            return "the server closed the connection";
        if (done < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
            return strerror(errno);
        if (done > 0) {
            p += done;
            n -= (size_t)done;
        }
    }
    return NULL;
}

/* Sends the body `req` on the fast connection, after its length, and receives the
 * reply into `reply`. Any failure closes the connection: the request on it is lost
 * (its late reply can never be read), and ZeroMQ serves the rest of the run. */
static enum exchange fast_exchange(struct client *c, const unsigned char *req, size_t len, size_t *size)
{
    unsigned char frame[4 + MAX_REQUEST], length[4];
    int64_t deadline = now_ms() + RECV_TIMEOUT_MS;
    put_u32(frame, (uint32_t)len);
    memcpy(frame + 4, req, len);
    const char *why = fast_io(c->fast, POLLOUT, frame, 4 + len, deadline);
    if (why == NULL)
        why = fast_io(c->fast, POLLIN, length, sizeof length, deadline);
    if (why == NULL) {
        *size = get_u32(length);
        if (*size == 0 || *size > MAX_REPLY) /* no reply is that long: the stream cannot be read on */
            why = "a garbled frame (impossible length)";
        else
            why = fast_io(c->fast, POLLIN, reply, *size, deadline);
    }
    if (why == NULL)
        return REPLIED;
    fprintf(stderr, "%s: fast port: %s; using ZeroMQ from now on\n", prog, why);
    close(c->fast);
    c->fast = -1;
    return FAST_DOWN;
}

/* Connects the non-blocking socket `fd` to `a` within CONNECT_TIMEOUT_MS: 0, or an errno value. */
static int connect_within(int fd, const struct addrinfo *a)
{
    struct pollfd pfd = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
        return 0;
    if (errno != EINPROGRESS)
        return errno;
    int ready = poll(&pfd, 1, CONNECT_TIMEOUT_MS);
    if (ready <= 0)
        return ready == 0 ? ETIMEDOUT : errno;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return errno;
    return err;
}

/* A TCP connection to HOST:PORT (non-blocking, TCP_NODELAY), or -1 after saying why. */
static int fast_open(const char *host, const char *port)
{
    struct addrinfo hints, *list;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(host, port, &hints, &list);
    if (rc != 0) {
        fprintf(stderr, "%s: fast port: cannot resolve %s: %s; using ZeroMQ\n", prog, host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, err = 0, one = 1;
    for (const struct addrinfo *a = list; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (fcntl(fd, F_SETFL, O_NONBLOCK) != 0 || setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
            err = errno;
        else
            err = connect_within(fd, a);
        if (err != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(list);
    if (fd < 0)
        fprintf(stderr, "%s: fast port: cannot connect to %s:%s: %s; using ZeroMQ\n", prog, host, port,
                strerror(err));
    return fd;
}

/* -- requests ------------------------------------------------------------------------------ */

enum outcome {
    GRANTED, /* *first and *count hold a block */
    RETRY,   /* a retriable error or a lost request: try again after a back-off */
    AGAIN,   /* the fast connection failed: ask again on ZeroMQ, at once */
    FAILED   /* give up: a non-retriable error or a protocol violation */
};

/* The last ERROR the server sent, for the driver's answer ("" for none). */
static char last_code[64];
static int last_retriable;

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
    snprintf(last_code, sizeof last_code, "%s", code);
    last_retriable = retry;
    free(json);
    return retry ? RETRY : FAILED;
}

/* Sends one RESERVE for `want` IDs, on the fast connection if there is one, and reads its reply. */
static enum outcome reserve_once(struct client *c, uint32_t want, uint64_t *first, uint32_t *count)
{
    unsigned char req[RESERVE_AFTER_SIZE];
    uint64_t request_id = c->next_request_id++;
    size_t size = 0, len = c->has_after ? RESERVE_AFTER_SIZE : RESERVE_SIZE;

    req[0] = PROTO_VERSION;
    req[1] = TYPE_RESERVE;
    put_u16(req + 2, c->has_after ? FLAG_AFTER : 0);
    put_u64(req + 4, request_id);
    put_u32(req + 12, want);
    if (c->has_after) /* every ID granted sorts after the token */
        put_u64(req + 16, c->after);
    enum exchange e = c->fast >= 0 ? fast_exchange(c, req, len, &size) : zmq_exchange(c, req, len, &size);
    if (e != REPLIED)
        return e == LOST ? RETRY : e == FAST_DOWN ? AGAIN : FAILED;

    enum outcome result = FAILED;
    const unsigned char *p = reply;
    if (size < HEADER_SIZE) {
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
    return result;
}

/* Sends NODES over ZeroMQ; on success (0) the reply's JSON, `*json_size` bytes, is
 * at reply + HEADER_SIZE, NUL-terminated. One try: the caller may run it again (a
 * lost reply needs no retry logic here). */
static int nodes_once(struct client *c, size_t *json_size)
{
    unsigned char req[HEADER_SIZE];
    uint64_t request_id = c->next_request_id++;
    size_t size = 0;
    req[0] = PROTO_VERSION;
    req[1] = TYPE_NODES;
    put_u16(req + 2, 0);
    put_u64(req + 4, request_id);
    if (zmq_exchange(c, req, sizeof req, &size) != REPLIED)
        return 1;
    if (size < HEADER_SIZE || reply[0] != PROTO_VERSION || get_u64(reply + 4) != request_id) {
        fprintf(stderr, "%s: protocol error: not a reply to NODES request %" PRIu64 "\n", prog, request_id);
    } else if (reply[1] == TYPE_ERROR) {
        on_error(reply, size);
    } else if (reply[1] != TYPE_NODES_REPLY) {
        fprintf(stderr, "%s: protocol error: unexpected reply type 0x%02x to NODES\n", prog, (unsigned)reply[1]);
    } else {
        reply[size] = '\0';
        *json_size = size - HEADER_SIZE;
        return 0;
    }
    return 1;
}

/* Sends WATERMARK over ZeroMQ; on success (0) the promise is in *unix_ms and *lowest. One
 * try, as nodes_once. */
static int watermark_once(struct client *c, uint64_t *unix_ms, uint64_t *lowest)
{
    unsigned char req[HEADER_SIZE];
    uint64_t request_id = c->next_request_id++;
    size_t size = 0;
    req[0] = PROTO_VERSION;
    req[1] = TYPE_WATERMARK;
    put_u16(req + 2, 0);
    put_u64(req + 4, request_id);
    if (zmq_exchange(c, req, sizeof req, &size) != REPLIED)
        return 1;
    if (size < HEADER_SIZE || reply[0] != PROTO_VERSION || get_u64(reply + 4) != request_id) {
        fprintf(stderr, "%s: protocol error: not a reply to WATERMARK request %" PRIu64 "\n", prog, request_id);
    } else if (reply[1] == TYPE_ERROR) {
        on_error(reply, size);
    } else if (reply[1] != TYPE_WATERMARK_REPLY || size != WATERMARK_REPLY_SIZE) {
        fprintf(stderr, "%s: protocol error: unexpected reply type 0x%02x to WATERMARK\n", prog, (unsigned)reply[1]);
    } else {
        *unix_ms = get_u64(reply + 12);
        *lowest = get_u64(reply + 20);
        return 0;
    }
    return 1;
}

/* For a tcp://HOST:PORT endpoint, unless SNOWFENCE_NO_FAST is set (and not 0): asks
 * NODES for the node's "fast_port", and connects to it on HOST. Without one, or when
 * anything fails, c->fast stays -1 and the requests go over ZeroMQ. */
static void find_fast_port(struct client *c)
{
    const char *off = getenv("SNOWFENCE_NO_FAST");
    if (strncmp(c->endpoint, "tcp://", 6) != 0 || (off != NULL && *off != '\0' && strcmp(off, "0") != 0))
        return;
    char host[256], port[8];
    const char *at = c->endpoint + 6, *colon = strrchr(at, ':');
    size_t n = colon != NULL ? (size_t)(colon - at) : 0;
    if (n >= 2 && at[0] == '[' && at[n - 1] == ']') { /* an IPv6 address */
        at++;
        n -= 2;
    }
    if (n == 0 || n >= sizeof host)
        return;
    memcpy(host, at, n);
    host[n] = '\0';

    size_t size;
    if (nodes_once(c, &size) != 0) {
        fprintf(stderr, "%s: NODES failed; using ZeroMQ\n", prog);
        return;
    }
    const char *v = json_member((const char *)reply + HEADER_SIZE, "fast_port");
    if (v == NULL || strncmp(v, "null", 4) == 0)
        return; /* the node has no fast port */
    char *end;
    long value = *v >= '1' && *v <= '9' ? strtol(v, &end, 10) : 0;
    if (value < 1 || value > 65535 || strchr(",} \t\r\n", *end) == NULL) {
        fprintf(stderr, "%s: NODES has a \"fast_port\" that is not a port; using ZeroMQ\n", prog);
        return;
    }
    snprintf(port, sizeof port, "%ld", value);
    c->fast = fast_open(host, port);
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

/* What to do with each block granted: IDs first .. first+count-1. */
typedef int (*emit_fn)(uint64_t first, uint32_t count, void *arg);

/* Reserves `remaining` IDs, one RESERVE at a time (at most 4,096 each), handing each block
 * to `emit`; 0 when all were granted, 1 otherwise (the blocks emitted are valid). */
static int reserve_ids(struct client *c, uint64_t remaining, emit_fn emit, void *arg)
{
    if (remaining > 0)
        find_fast_port(c);
    int status = 0, attempts = 0;
    long backoff_ms = BACKOFF_MS;
    while (remaining > 0) {
        uint32_t want = remaining < MAX_COUNT ? (uint32_t)remaining : MAX_COUNT;
        uint64_t first = 0;
        uint32_t count = 0;
        enum outcome r = reserve_once(c, want, &first, &count);
        if (r == GRANTED) {
            /* count may be less than asked (a partial grant): ask again for the rest. */
            if (emit(first, count, arg) != 0)
                return 1;
            remaining -= count;
            attempts = 0;
            backoff_ms = BACKOFF_MS;
            continue;
        }
        if (r == AGAIN) /* at most once: the fast connection is gone for good */
            continue;
        if (r == FAILED || ++attempts >= MAX_ATTEMPTS) {
            if (r == RETRY)
                fprintf(stderr, "%s: giving up after %d attempts\n", prog, attempts);
            status = 1;
            break;
        }
        sleep_ms(backoff_ms);
        backoff_ms *= 2;
    }
    if (c->fast >= 0) {
        close(c->fast);
        c->fast = -1;
    }
    return status;
}

static int print_ids(uint64_t first, uint32_t count, void *arg)
{
    (void)arg;
    for (uint32_t i = 0; i < count; i++)
        printf("%" PRIu64 "\n", first + i);
    return 0;
}

/* -- the conformance suite's driver protocol ----------------------------------------------- */

/* The blocks of one reservation, kept until the answer is written. */
struct blocks {
    uint64_t *first;
    uint32_t *count;
    size_t n, cap;
};

static int keep_block(uint64_t first, uint32_t count, void *arg)
{
    struct blocks *b = arg;
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        uint64_t *f = realloc(b->first, cap * sizeof *f);
        if (f != NULL)
            b->first = f;
        uint32_t *k = realloc(b->count, cap * sizeof *k);
        if (k != NULL)
            b->count = k;
        if (f == NULL || k == NULL) {
            fprintf(stderr, "%s: out of memory\n", prog);
            return 1;
        }
        b->cap = cap;
    }
    b->first[b->n] = first;
    b->count[b->n++] = count;
    return 0;
}

/* One case of the driver protocol (one JSON object on a line): performs it and writes its
 * answer, one JSON line. Cases: "reserve" (with "count", and "after" if given), "nodes" and
 * "watermark"; any other case is answered unsupported. */
static void drive_one(const char *line)
{
    char kase[32], endpoint[1024], id[32] = "null";
    const char *v = json_member(line, "id");
    if (v != NULL && *v >= '0' && *v <= '9') {
        size_t n = strspn(v, "0123456789");
        if (n < sizeof id) {
            memcpy(id, v, n);
            id[n] = '\0';
        }
    }
    json_string(json_member(line, "case"), kase, sizeof kase);
    json_string(json_member(line, "endpoint"), endpoint, sizeof endpoint);
    printf("{\"id\": %s, ", id);
    int reserve = strcmp(kase, "reserve") == 0, nodes = strcmp(kase, "nodes") == 0;
    int watermark = strcmp(kase, "watermark") == 0;
    uint64_t count = 0, after = 0;
    const char *av = json_member(line, "after");
    char token[24] = "";
    if (reserve) {
        const char *cv = json_member(line, "count");
        char digits[24] = "";
        if (cv != NULL)
            snprintf(digits, sizeof digits, "%.*s", (int)strspn(cv, "0123456789"), cv);
        json_string(av, token, sizeof token); /* a decimal string */
        if (parse_count(digits, &count) != 0 || (av != NULL && parse_count(token, &after) != 0))
            reserve = 0;
    }
    if (!reserve && !nodes && !watermark) {
        printf("\"unsupported\": true}\n");
        return;
    }
    struct client c = {zmq_ctx_new(), NULL, endpoint, 1, -1, av != NULL, after};
    int rc = 1;
    last_code[0] = '\0';
    if (c.ctx != NULL && open_socket(&c) == 0) {
        if (nodes) {
            size_t size;
            rc = nodes_once(&c, &size);
            if (rc == 0)
                printf("\"nodes\": %s}\n", (const char *)reply + HEADER_SIZE);
        } else if (watermark) {
            uint64_t unix_ms, lowest;
            rc = watermark_once(&c, &unix_ms, &lowest);
            if (rc == 0)
                printf("\"watermark\": {\"unix_ms\": %" PRIu64 ", \"lowest\": \"%" PRIu64 "\"}}\n", unix_ms,
                       lowest);
        } else {
            struct blocks b = {NULL, NULL, 0, 0};
            rc = reserve_ids(&c, count, keep_block, &b);
            if (rc == 0) {
                printf("\"ids\": [");
                const char *sep = "";
                for (size_t i = 0; i < b.n; i++)
                    for (uint32_t k = 0; k < b.count[i]; k++, sep = ", ")
                        printf("%s\"%" PRIu64 "\"", sep, b.first[i] + k);
                printf("]}\n");
            }
            free(b.first);
            free(b.count);
        }
        close_socket(&c);
    }
    if (c.ctx != NULL)
        zmq_ctx_term(c.ctx);
    if (rc != 0) /* no ERROR from the server: lost replies, or a protocol violation */
        printf("\"error\": {\"code\": \"%s\", \"retriable\": %s}}\n", last_code[0] ? last_code : "client",
               last_code[0] && last_retriable ? "true" : "false");
}

static int driver(void)
{
    static char line[1 << 16];
    while (fgets(line, sizeof line, stdin) != NULL) {
        drive_one(line);
        if (fflush(stdout) != 0)
            return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--driver") == 0)
        return driver();
    uint64_t remaining = 0;
    int nodes = argc == 3 && strcmp(argv[2], "--nodes") == 0;
    if (argc != 3 || (!nodes && parse_count(argv[2], &remaining) != 0)) {
        fprintf(stderr,
                "usage: %s ENDPOINT N\n  reserves N IDs and prints one per line\n"
                "       %s ENDPOINT --nodes\n  prints the cluster's live nodes (JSON)\n"
                "       %s --driver\n  the conformance suite's driver protocol on stdin and stdout\n",
                prog, prog, prog);
        return 2;
    }

    struct client c = {zmq_ctx_new(), NULL, argv[1], 1, -1, 0, 0};
    if (c.ctx == NULL || open_socket(&c) != 0)
        return 1;
    if (nodes) {
        size_t size;
        int rc = nodes_once(&c, &size);
        if (rc == 0) {
            fwrite(reply + HEADER_SIZE, 1, size, stdout);
            putchar('\n');
        }
        close_socket(&c);
        zmq_ctx_term(c.ctx);
        fflush(stdout);
        return rc;
    }

    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);

    int status = reserve_ids(&c, remaining, print_ids, NULL);

    close_socket(&c);
    zmq_ctx_term(c.ctx);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s: cannot write to stdout\n", prog);
        status = 1;
    }
    return status;
}
