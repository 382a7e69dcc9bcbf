/* A nearly full disk for one process, for the tests: preloaded (LD_PRELOAD), it lets the files
 * under $ENOSPC_DIR grow by $ENOSPC_BUDGET bytes in all and then fails what would grow them
 * further with ENOSPC, as a real full disk does. Writes over existing bytes cost nothing;
 * truncating or removing a file gives its bytes back, as on a real filesystem. Once the file
 * $ENOSPC_TRIGGER exists (a test creates it), the disk is full from then on: another program
 * took the rest, and only what this process frees again can be used. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static long long budget = -1;
static const char *watched_dir;
static int filled;

static void setup(void) {
    if (budget >= 0 || watched_dir) return;
    watched_dir = getenv("ENOSPC_DIR");
    const char *b = getenv("ENOSPC_BUDGET");
    budget = b ? atoll(b) : 0;
}

static int watched_path(const char *path) {
    setup();
    return watched_dir && path && strncmp(path, watched_dir, strlen(watched_dir)) == 0;
}

static int watched_fd(int fd) {
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    return watched_path(path);
}

static void fill_if_triggered(void) {
    const char *trigger = getenv("ENOSPC_TRIGGER");
    struct stat st;
    if (!filled && trigger && stat(trigger, &st) == 0) { filled = 1; budget = 0; }
}

/* Charge the growth of `fd` to `end` bytes; 0 if it fits, else -1 with errno ENOSPC. */
static int charge(int fd, long long end) {
    struct stat st;
    if (!watched_fd(fd) || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || end <= st.st_size) return 0;
    fill_if_triggered();
    long long need = end - st.st_size;
    if (need > budget) { errno = ENOSPC; return -1; }
    budget -= need;
    return 0;
}

static void refund(int fd, long long new_size) {
    struct stat st;
    if (watched_fd(fd) && fstat(fd, &st) == 0 && new_size < st.st_size) budget += st.st_size - new_size;
}

ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "write");
    if (fd > 2) {
        struct stat st;
        long long at = (fcntl(fd, F_GETFL) & O_APPEND) && fstat(fd, &st) == 0 ? st.st_size : lseek(fd, 0, SEEK_CUR);
        if (at >= 0 && charge(fd, at + (long long)n) != 0) return -1;
    }
    return real(fd, buf, n);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off) {
    static ssize_t (*real)(int, const void *, size_t, off64_t);
    if (!real) real = dlsym(RTLD_NEXT, "pwrite64");
    if (charge(fd, off + (long long)n) != 0) return -1;
    return real(fd, buf, n, off);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) { return pwrite64(fd, buf, n, off); }

int ftruncate64(int fd, off64_t length) {
    static int (*real)(int, off64_t);
    if (!real) real = dlsym(RTLD_NEXT, "ftruncate64");
    if (charge(fd, length) != 0) return -1;
    refund(fd, length);
    return real(fd, length);
}

int ftruncate(int fd, off_t length) { return ftruncate64(fd, length); }

int unlink(const char *path) {
    static int (*real)(const char *);
    if (!real) real = dlsym(RTLD_NEXT, "unlink");
    struct stat st;
    int freed = watched_path(path) && stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1;
    int rc = real(path);
    if (rc == 0 && freed) budget += st.st_size;
    return rc;
}
