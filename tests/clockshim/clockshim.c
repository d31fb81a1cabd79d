/*
 * clockshim: shift CLOCK_REALTIME (only) of the processes it is preloaded into.
 *
 * LD_PRELOAD=libclockshim.so SNOWFENCE_CLOCKSHIM=/path/to/table
 *
 * The table is a file the test maps too and writes while the processes run:
 *     int64 global_offset_ns
 *     64 x { int64 pid; int64 offset_ns }
 * A process's wall clock is shifted by the global offset plus its own entry.
 * CLOCK_MONOTONIC and friends are never touched: durations stay honest, which
 * is exactly the situation of a host whose wall clock is stepped.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 64

struct table {
    volatile int64_t global_ns;
    struct { volatile int64_t pid; volatile int64_t offset_ns; } slot[SLOTS];
};

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static struct table *table;
static int tried;

static void init(void) {
    if (!real_clock_gettime)
        real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    if (!tried) {
        tried = 1;
        const char *path = getenv("SNOWFENCE_CLOCKSHIM");
        if (path) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *p = mmap(NULL, sizeof(struct table), PROT_READ, MAP_SHARED, fd, 0);
                close(fd);
                if (p != MAP_FAILED) table = p;
            }
        }
    }
}

static int64_t offset_ns(void) {
    if (!table) return 0;
    int64_t off = table->global_ns;
    int64_t me = getpid();
    for (int i = 0; i < SLOTS; i++)
        if (table->slot[i].pid == me) { off += table->slot[i].offset_ns; break; }
    return off;
}

static void shift(struct timespec *ts) {
    int64_t off = offset_ns();
    if (!off) return;
    int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + off;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) { ts->tv_nsec += 1000000000LL; ts->tv_sec -= 1; }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    init();
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        shift(ts);
    return rc;
}

#pragma GCC diagnostic ignored "-Wnonnull-compare"
int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0 && tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
