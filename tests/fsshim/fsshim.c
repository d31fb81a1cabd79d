/*
 * fsshim: make the filesystem look different to the processes it is preloaded into.
 *
 * LD_PRELOAD=libfsshim.so, then:
 *   SNOWFENCE_FSSHIM_FSTYPE=0x6969   statfs(2) reports this f_type (0x6969: NFS)
 *   SNOWFENCE_FSSHIM_FSYNC_MS=300    every fsync(2) of a regular file first sleeps this
 *                                    long (a slow disk; directories sync at once)
 *
 * Everything else passes through to the C library.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

int statfs(const char *path, struct statfs *buf) {
    static int (*real)(const char *, struct statfs *);
    if (!real) real = dlsym(RTLD_NEXT, "statfs");
    int rc = real(path, buf);
    const char *fake = getenv("SNOWFENCE_FSSHIM_FSTYPE");
    if (rc == 0 && fake && *fake) buf->f_type = strtol(fake, NULL, 0);
    return rc;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = dlsym(RTLD_NEXT, "fsync");
    const char *ms = getenv("SNOWFENCE_FSSHIM_FSYNC_MS");
    struct stat st;
    if (ms && *ms && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        long n = strtol(ms, NULL, 10);
        struct timespec ts = {n / 1000, (n % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return real(fd);
}
