/* Test helper for tests/harness/test_harness_safety.py, loaded with LD_PRELOAD into smoe-stream:
 * the first time a pread on the file SMOE_SHRINK_FILE reaches past byte SMOE_SHRINK_AT,
 * the file is truncated to SMOE_SHRINK_TO bytes before the read runs. The vault thus
 * shrinks under the reader after it was opened and checked, at a point fixed by the
 * test rather than by timing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int done;

static void maybe_shrink(int fd, size_t n, off_t off) {
    const char* file = getenv("SMOE_SHRINK_FILE");
    const char* at = getenv("SMOE_SHRINK_AT");
    const char* to = getenv("SMOE_SHRINK_TO");
    struct stat a, b;
    if (__atomic_load_n(&done, __ATOMIC_ACQUIRE) || !file || !at || !to)
        return;
    if ((unsigned long long)off + n <= strtoull(at, NULL, 10))
        return;
    if (fstat(fd, &a) != 0 || stat(file, &b) != 0)
        return;
    if (a.st_dev != b.st_dev || a.st_ino != b.st_ino)
        return;
    if (__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL) == 0)
        (void)truncate(file, (off_t)strtoull(to, NULL, 10));
}

typedef ssize_t (*pread_fn)(int, void*, size_t, off_t);

ssize_t pread(int fd, void* buf, size_t n, off_t off) {
    static pread_fn real;
    if (!real)
        real = (pread_fn)dlsym(RTLD_NEXT, "pread");
    maybe_shrink(fd, n, off);
    return real(fd, buf, n, off);
}

ssize_t pread64(int fd, void* buf, size_t n, off_t off) {
    static pread_fn real;
    if (!real)
        real = (pread_fn)dlsym(RTLD_NEXT, "pread64");
    maybe_shrink(fd, n, off);
    return real(fd, buf, n, off);
}
