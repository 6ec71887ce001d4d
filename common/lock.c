/* lock.c — one process at a time on a work directory or an output (kvq/util.h "locks").
 *
 * A lock is flock(2) on a lock file: the kernel drops it when the process ends, however
 * it ends (kill -9 included), so a lock is never left stuck; a leftover file is taken by
 * the next run. The holder writes who it is into the file (pid, host, start time,
 * command line), which the refused run quotes. The file is removed on release; a run
 * that locked a file someone then removed (it held a stale inode) takes the new one. */
#include "kvq/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Appends s[0..len) to buf at *n, as much as fits below cap - 1. */
static void put(char *buf, size_t cap, size_t *n, const char *s, size_t len)
{
    if (len > cap - 1 - *n)
        len = cap - 1 - *n;
    memcpy(buf + *n, s, len);
    *n += len;
}

/* Appends one argument, in single quotes unless it is all letters, digits and
 * -_./=:,+%@ (a quote inside written '\''). */
static void put_arg(char *buf, size_t cap, size_t *n, const char *arg)
{
    int plain = *arg != 0;
    for (const char *p = arg; *p && plain; p++)
        plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                (*p >= '0' && *p <= '9') || strchr("-_./=:,+%@", *p) != NULL;
    if (plain) {
        put(buf, cap, n, arg, strlen(arg));
        return;
    }
    put(buf, cap, n, "'", 1);
    for (const char *p = arg; *p; p++)
        put(buf, cap, n, *p == '\'' ? "'\\''" : p, *p == '\'' ? 4 : 1);
    put(buf, cap, n, "'", 1);
}

void kvq_self_command(char *buf, size_t cap)
{
    if (!cap)
        return;
    buf[0] = 0;
    char raw[4096];
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f)
        return;
    const size_t len = fread(raw, 1, sizeof raw - 1, f);
    fclose(f);
    raw[len] = 0;
    size_t n = 0;
    for (size_t i = 0; i < len; i += strlen(raw + i) + 1) {
        if (i)
            put(buf, cap, &n, " ", 1);
        put_arg(buf, cap, &n, raw + i);
    }
    buf[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\n' || buf[i] == '\r')
            buf[i] = ' ';
}

/* The holder's line ("pid P on host H since T: CMD") of a lock file, into buf. */
static void read_holder(int fd, char *buf, size_t cap)
{
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    buf[strcspn(buf, "\n")] = 0;
    if (!buf[0])
        snprintf(buf, cap, "a process that has not written its name yet");
}

kvq_status kvq_lock_take(const char *lock_path, const char *what, kvq_lock *lk, kvq_err *err)
{
    lk->fd = -1;
    lk->path = NULL;
    for (int attempt = 0; attempt < 16; attempt++) {
        int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
            return kvq_err_set(err, KVQ_E_IO, "%s: cannot create: %s (its lock file %s)", what,
                               strerror(errno), lock_path);
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int e = errno;
            char holder[512];
            read_holder(fd, holder, sizeof holder);
            close(fd);
            if (e != EWOULDBLOCK)
                return kvq_err_set(err, KVQ_E_IO, "%s: cannot lock: %s", lock_path, strerror(e));
            return kvq_err_set(err, KVQ_E_EXISTS, "%s is in use by another kvq run (%s); wait "
                               "for it to finish or stop it (lock %s)", what, holder, lock_path);
        }
        /* The file may have been removed (released) between open and flock. */
        struct stat a, b;
        if (fstat(fd, &a) != 0 || stat(lock_path, &b) != 0 || a.st_ino != b.st_ino ||
            a.st_dev != b.st_dev) {
            close(fd);
            continue;
        }
        char host[256] = "?", cmd[300], line[800], when[32] = "?";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = 0;
        kvq_self_command(cmd, sizeof cmd);
        const time_t now = time(NULL);
        struct tm tm;
        if (gmtime_r(&now, &tm))
            strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        const int n = snprintf(line, sizeof line, "pid %ld on host %s since %s: %s\n",
                               (long)getpid(), host, when, cmd[0] ? cmd : "?");
        if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n) {
            const int e = errno;
            close(fd);
            return kvq_err_set(err, KVQ_E_IO, "%s: cannot write the lock file: %s", lock_path,
                               strerror(e));
        }
        if (!(lk->path = strdup(lock_path))) {
            close(fd);
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", lock_path);
        }
        lk->fd = fd;
        kvq_output_register(lk->path); /* a signal handler's cleanup removes it too */
        return KVQ_OK;
    }
    return kvq_err_set(err, KVQ_E_IO, "%s: the lock file keeps being replaced", lock_path);
}

kvq_status kvq_lock_output(const char *out_path, kvq_lock *lk, kvq_err *err)
{
    lk->fd = -1;
    lk->path = NULL;
    /* "DIR/." or "DIR/" name DIR itself: its lock goes next to it, not inside */
    const char *base = strrchr(out_path, '/');
    base = base ? base + 1 : out_path;
    char *real = NULL;
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        real = realpath(out_path, NULL);
    const char *name = real ? real : out_path;
    char *p = malloc(strlen(name) + sizeof ".lock");
    if (!p) {
        free(real);
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", out_path);
    }
    sprintf(p, "%s.lock", name);
    free(real);
    kvq_status st = kvq_lock_take(p, out_path, lk, err);
    free(p);
    return st;
}

void kvq_lock_release(kvq_lock *lk)
{
    if (!lk || lk->fd < 0)
        return;
    if (lk->path) {
        kvq_output_unregister(lk->path);
        unlink(lk->path); /* while held: a waiting opener then sees a stale inode */
    }
    close(lk->fd);
    free(lk->path);
    lk->fd = -1;
    lk->path = NULL;
}
