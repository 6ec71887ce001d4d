/*
 * bench_checksum.c — what verifying an intermediate's checksum costs against reading it
 * (issue 30 item 9): for each FILE, best of --runs of
 *   read      read(2) of the whole file into memory, page cache warm (the cheapest read
 *             a stage can do: a memory copy)
 *   cold      the same after posix_fadvise(DONTNEED) evicted the file's pages (a read
 *             from the disk, as a stage's first pass over a new capture)
 *   xxh64     kvq_xxh64 over those bytes (the check kvq_st_open and
 *             kvq_capture_layer_open add)
 * and the ratio of each to the read, in the same run.
 *
 *   bench_checksum FILE... [--runs N]
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq.h"
#include "kvq/util.h"

static volatile uint64_t sink;

static double read_all(const char *path, uint8_t *buf, size_t n, int cold)
{
    if (cold) { /* this file's pages only: other processes' caches are left alone */
        int e = open(path, O_RDONLY);
        if (e >= 0) {
            posix_fadvise(e, 0, 0, POSIX_FADV_DONTNEED);
            close(e);
        }
    }
    const double t0 = kvq_now();
    int fd = open(path, O_RDONLY);
    size_t got = 0;
    ssize_t r;
    while (fd >= 0 && got < n && (r = read(fd, buf + got, n - got)) > 0)
        got += (size_t)r;
    if (fd >= 0)
        close(fd);
    sink += got;
    return kvq_now() - t0;
}

int main(int argc, char **argv)
{
    int runs = 5, nfiles = 0;
    const char *files[64];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (nfiles < 64)
            files[nfiles++] = argv[i];
    }
    if (!nfiles || runs < 1) {
        fprintf(stderr, "usage: bench_checksum FILE... [--runs N]\n");
        return 2;
    }
    printf("%-28s %8s %9s %9s %9s %8s %10s %10s\n", "file", "MiB", "read ms", "cold ms",
           "xxh64 ms", "GB/s", "xxh/read", "xxh/cold");
    for (int f = 0; f < nfiles; f++) {
        struct stat st;
        if (stat(files[f], &st) != 0 || !S_ISREG(st.st_mode)) {
            fprintf(stderr, "%s: not a regular file\n", files[f]);
            return 1;
        }
        const size_t n = (size_t)st.st_size;
        uint8_t *buf = malloc(n ? n : 1);
        if (!buf)
            return 1;
        double best_read = 1e30, best_hash = 1e30, best_cold = 1e30;
        for (int r = 0; r < runs; r++) { /* alternated, best of runs */
            double t = read_all(files[f], buf, n, 1);
            best_cold = t < best_cold ? t : best_cold;
            t = read_all(files[f], buf, n, 0);
            best_read = t < best_read ? t : best_read;
            double t0 = kvq_now();
            sink += kvq_xxh64(buf, n, 0);
            t = kvq_now() - t0;
            best_hash = t < best_hash ? t : best_hash;
        }
        const char *base = strrchr(files[f], '/');
        printf("%-28.28s %8.2f %9.3f %9.3f %9.3f %8.2f %10.3f %10.3f\n",
               base ? base + 1 : files[f], n / 1048576.0, 1e3 * best_read, 1e3 * best_cold,
               1e3 * best_hash, n / best_hash / 1e9, best_hash / best_read,
               best_hash / best_cold);
        free(buf);
    }
    return 0;
}
