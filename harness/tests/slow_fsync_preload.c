/* Test helper for tests/harness/test_exit_codes.py, loaded with LD_PRELOAD into smoe-stream:
 * the first fsync() creates the file SMOE_FSYNC_MARK and then waits a minute before it runs,
 * so that a test can send a signal while an output is written under its temporary name, at
 * a point fixed by the test rather than by timing. With SMOE_FSYNC_MATCH set, only an fsync
 * of a file whose path contains it counts (not, say, a code cache written at start-up). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int done;

static int matches(int fd) {
    const char* want = getenv("SMOE_FSYNC_MATCH");
    char link[64], path[4096];
    if (!want)
        return 1;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0)
        return 0;
    path[n] = 0;
    return strstr(path, want) != NULL;
}

typedef int (*fsync_fn)(int);

int fsync(int fd) {
    static fsync_fn real;
    const char* mark = getenv("SMOE_FSYNC_MARK");
    if (!real)
        real = (fsync_fn)dlsym(RTLD_NEXT, "fsync");
    if (mark && matches(fd) && __atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL) == 0) {
        const int m = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (m >= 0)
            close(m);
        sleep(60);
    }
    return real(fd);
}
