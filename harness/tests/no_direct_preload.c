/* Test helper for tests/stream/test_cache.py, loaded with LD_PRELOAD into smoe-stream: a file
 * system that refuses O_DIRECT, as some do (EINVAL), wherever the tests run.
 * SMOE_NO_DIRECT=open: an open with O_DIRECT fails with EINVAL; =read: the open succeeds and
 * every pread on a descriptor in O_DIRECT mode fails with EINVAL. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static int refuses(const char* when) {
    const char* mode = getenv("SMOE_NO_DIRECT");
    return mode != NULL && strcmp(mode, when) == 0;
}

typedef int (*open_fn)(const char*, int, ...);

static int open_with(const char* name, const char* path, int flags, va_list ap) {
    open_fn real = (open_fn)dlsym(RTLD_NEXT, name);
    mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
    if ((flags & O_DIRECT) && refuses("open")) {
        errno = EINVAL;
        return -1;
    }
    return real(path, flags, mode);
}

int open(const char* path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int fd = open_with("open", path, flags, ap);
    va_end(ap);
    return fd;
}

int open64(const char* path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int fd = open_with("open64", path, flags, ap);
    va_end(ap);
    return fd;
}

typedef ssize_t (*pread_fn)(int, void*, size_t, off_t);

static ssize_t pread_with(const char* name, int fd, void* buf, size_t n, off_t off) {
    pread_fn real = (pread_fn)dlsym(RTLD_NEXT, name);
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0 && (flags & O_DIRECT) && refuses("read")) {
        errno = EINVAL;
        return -1;
    }
    return real(fd, buf, n, off);
}

ssize_t pread(int fd, void* buf, size_t n, off_t off) {
    return pread_with("pread", fd, buf, n, off);
}

ssize_t pread64(int fd, void* buf, size_t n, off_t off) {
    return pread_with("pread64", fd, buf, n, off);
}
