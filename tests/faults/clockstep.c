/* A node's wall clock, stepped: an LD_PRELOAD library for the fault suite.

   An NTP step moves CLOCK_REALTIME and nothing else; the kernel cannot step it for
   one process (time namespaces shift only MONOTONIC and BOOTTIME), and stepping the
   machine's clock would step every other program on it. So the agent under test runs
   with this library preloaded: clock_gettime(CLOCK_REALTIME*), gettimeofday() and
   time() return the real time plus an offset in nanoseconds, read on every call from
   the first 8 bytes (a native int64) of the file named by FF_CLOCK_OFFSET_FILE, which
   the harness rewrites in place (pwrite) to step the clock. The monotonic clocks,
   sleeps and timers are untouched, as in a real step. File mtimes stay the kernel's.

   Built by tests/faults/harness.py: cc -shared -fPIC -O2 -o libclockstep.so clockstep.c -ldl
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

static volatile int64_t *offset_ns;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

static void init(void) {
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    const char *path = getenv("FF_CLOCK_OFFSET_FILE");
    if (path == NULL)
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED)
        offset_ns = (volatile int64_t *)p;
}

static int64_t offset(void) {
    return offset_ns != NULL ? *offset_ns : 0;
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset();
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (real_clock_gettime == NULL)
        init();
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        shift(ts);
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    if (tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t != NULL)
        *t = ts.tv_sec;
    return ts.tv_sec;
}
