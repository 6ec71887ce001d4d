/* output.c — how every stage writes an output (kvq/util.h "output"): temporaries named
 * "<path>.tmp.<pid>.<random>" renamed into place when complete, the check that an
 * existing output is kvq's own before --force replaces it, directories replaced so that
 * no failure loses both the old and the new one, and a registry of the temporaries
 * that a signal handler can remove and a rerun cleans when their process is gone. */
#include "kvq/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ==========================================================================
 * The registry of this process's temporaries
 * ========================================================================== */

#define REG_SLOTS 64
#define REG_PATH 4096

static struct {
    volatile sig_atomic_t used;
    char path[REG_PATH];
} reg[REG_SLOTS];
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;

static void reg_add(const char *path)
{
    if (strlen(path) >= REG_PATH)
        return;
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < REG_SLOTS; i++) {
        if (!reg[i].used) {
            strcpy(reg[i].path, path);
            __atomic_store_n(&reg[i].used, 1, __ATOMIC_RELEASE);
            break;
        }
    }
    pthread_mutex_unlock(&reg_mu);
}

static void reg_del(const char *path)
{
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < REG_SLOTS; i++) {
        if (reg[i].used && !strcmp(reg[i].path, path)) {
            __atomic_store_n(&reg[i].used, 0, __ATOMIC_RELEASE);
            break;
        }
    }
    pthread_mutex_unlock(&reg_mu);
}

void kvq_output_register(const char *path) { reg_add(path); }
void kvq_output_unregister(const char *path) { reg_del(path); }

/* Removes name (relative to dirfd) and, if it is a directory, everything under it, with
 * system calls only (no malloc, no stdio): callable from a signal handler. */
static void rm_at(int dirfd, const char *name, int depth)
{
    if (unlinkat(dirfd, name, 0) == 0 || (errno != EISDIR && errno != EPERM) || depth > 16)
        return;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[4096] __attribute__((aligned(8)));
    for (int pass = 0, removed = 1; removed && pass < 64; pass++) {
        removed = 0;
        lseek(fd, 0, SEEK_SET);
        long n;
        while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
            for (long off = 0; off < n;) {
                const char *e = buf + off;
                unsigned short reclen;
                memcpy(&reclen, e + 16, sizeof reclen);
                const char *ename = e + 19;
                off += reclen;
                if (!strcmp(ename, ".") || !strcmp(ename, ".."))
                    continue;
                rm_at(fd, ename, depth + 1);
                removed = 1;
            }
        }
    }
    close(fd);
    unlinkat(dirfd, name, AT_REMOVEDIR);
}

void kvq_output_remove_temporaries(void)
{
    for (int i = 0; i < REG_SLOTS; i++)
        if (__atomic_load_n(&reg[i].used, __ATOMIC_ACQUIRE))
            rm_at(AT_FDCWD, reg[i].path, 0);
}

void kvq_rmtree(const char *path)
{
    reg_del(path);
    rm_at(AT_FDCWD, path, 0);
}

/* ==========================================================================
 * Temporary names and stale temporaries
 * ========================================================================== */

/* "<path>.tmp.<pid>.<8 hex>", malloc'd. */
static char *tmp_name_for(const char *path)
{
    static unsigned counter;
    const size_t n = strlen(path) + 5 + 20 + 1 + 8 + 1;
    char *t = malloc(n);
    if (!t)
        return NULL;
    uint64_t x = (uint64_t)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) << 20 ^
                 (uint64_t)(kvq_now() * 1e9);
    x ^= x >> 29;
    x *= 0x9E3779B97F4A7C15ULL;
    snprintf(t, n, "%s.tmp.%ld.%08x", path, (long)getpid(), (unsigned)(x >> 32));
    return t;
}

/* The pid of a temporary's name suffix "<pid>.<8 hex>", or 0 when it is not one. */
static long tmp_suffix_pid(const char *s)
{
    char *end;
    errno = 0;
    long pid = strtol(s, &end, 10);
    if (errno || pid <= 0 || end == s || *end != '.' || strlen(end + 1) != 8)
        return 0;
    for (const char *h = end + 1; *h; h++)
        if (!((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f')))
            return 0;
    return pid;
}

/* Removes the temporaries "<base>.tmp.<pid>.<8 hex>" in dir (base NULL: of any name)
 * of other processes: only those whose process is gone unless any_pid. Returns how many. */
static int clean_in(const char *dir, const char *base, int any_pid)
{
    DIR *d = opendir(dir);
    const size_t nb = base ? strlen(base) : 0;
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d))) {
        const char *t = base ? e->d_name + nb : strstr(e->d_name, ".tmp.");
        if (!t || (base && strncmp(e->d_name, base, nb)) || strncmp(t, ".tmp.", 5))
            continue;
        const long pid = tmp_suffix_pid(t + 5);
        if (!pid || pid == (long)getpid())
            continue;
        if (!any_pid && (kill((pid_t)pid, 0) == 0 || errno != ESRCH))
            continue;
        char *p = kvq_path_join(dir, e->d_name);
        if (p)
            rm_at(AT_FDCWD, p, 0);
        free(p);
        n++;
    }
    if (d)
        closedir(d);
    return n;
}

static int clean_of(const char *path, int any_pid)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    const int n = dir ? clean_in(dir, base, any_pid) : 0;
    free(dir);
    return n;
}

void kvq_output_clean_stale(const char *path)
{
    clean_of(path, 0);
}

int kvq_output_clean_job(const char *path, const char *inner_dir)
{
    return clean_of(path, 1) + (inner_dir ? clean_in(inner_dir, NULL, 1) : 0);
}

/* ==========================================================================
 * The output check
 * ========================================================================== */

kvq_status kvq_output_check(const char *path, int overwrite, kvq_output_owned_fn owned,
                            const char *what, kvq_err *err)
{
    struct stat st;
    if (!path || !*path)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "no output path");
    if (lstat(path, &st) == 0) {
        if (!overwrite)
            return kvq_err_set(err, KVQ_E_EXISTS, "%s: already exists (use --force to overwrite)",
                               path);
        if (!owned || !owned(path))
            return kvq_err_set(err, KVQ_E_EXISTS, "%s: exists and is not %s; kvq replaces only "
                               "its own outputs (remove it or choose another path)", path,
                               what ? what : "a kvq output");
    }
    kvq_output_clean_stale(path);
    char *probe = tmp_name_for(path);
    if (!probe)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    kvq_status s = KVQ_OK;
    if (fd < 0)
        s = kvq_err_set(err, KVQ_E_IO, "%s: cannot create: %s", path, strerror(errno));
    else {
        close(fd);
        unlink(probe);
    }
    free(probe);
    return s;
}

/* ==========================================================================
 * Files
 * ========================================================================== */

kvq_status kvq_atomic_open(const char *path, int overwrite, kvq_atomic_file *af, kvq_err *err)
{
    memset(af, 0, sizeof *af);
    if (!overwrite && access(path, F_OK) == 0)
        return kvq_err_set(err, KVQ_E_EXISTS, "%s: already exists (use --force to overwrite)",
                           path);
    kvq_output_clean_stale(path);
    af->path = strdup(path);
    af->tmp_path = tmp_name_for(path);
    if (!af->path || !af->tmp_path) {
        kvq_atomic_abort(af);
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
    }
    reg_add(af->tmp_path);
    int fd = open(af->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        kvq_status s = kvq_err_set(err, KVQ_E_IO, "%s: cannot create: %s", path, strerror(errno));
        reg_del(af->tmp_path);
        free(af->tmp_path);
        af->tmp_path = NULL;
        kvq_atomic_abort(af);
        return s;
    }
    af->fp = fdopen(fd, "wb");
    if (!af->fp) {
        close(fd);
        kvq_atomic_abort(af);
        return kvq_err_set(err, KVQ_E_IO, "%s: fdopen failed", path);
    }
    return KVQ_OK;
}

kvq_status kvq_atomic_commit(kvq_atomic_file *af, kvq_err *err)
{
    kvq_status s = KVQ_OK;
    if (!af->fp)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "atomic file not open");
    const long long size = ftello(af->fp); /* what was written, for the message */
    int bad = fflush(af->fp) != 0 || ferror(af->fp);
    if (!bad)
        bad = fsync(fileno(af->fp)) != 0;
    int e = errno;
    if (fclose(af->fp) != 0)
        bad = 1;
    af->fp = NULL;
    if (bad)
        s = kvq_err_set(err, KVQ_E_IO, "%s: write failed (%lld bytes): %s", af->path,
                        (long long)size, strerror(e));
    else if (rename(af->tmp_path, af->path) != 0)
        s = kvq_err_set(err, KVQ_E_IO, "%s: rename failed: %s", af->path, strerror(errno));
    else {
        reg_del(af->tmp_path);
        free(af->tmp_path);
        af->tmp_path = NULL;
    }
    kvq_atomic_abort(af);
    return s;
}

void kvq_atomic_abort(kvq_atomic_file *af)
{
    if (!af)
        return;
    if (af->fp)
        fclose(af->fp);
    if (af->tmp_path) {
        unlink(af->tmp_path);
        reg_del(af->tmp_path);
    }
    free(af->tmp_path);
    free(af->path);
    memset(af, 0, sizeof *af);
}

/* ==========================================================================
 * Directories
 * ========================================================================== */

kvq_status kvq_tmpdir_create(const char *path, int overwrite, kvq_output_owned_fn owned,
                             const char *what, char **tmp_dir, kvq_err *err)
{
    *tmp_dir = NULL;
    kvq_status s = kvq_output_check(path, overwrite, owned, what, err);
    if (s)
        return s;
    char *t = tmp_name_for(path);
    if (!t)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
    reg_add(t);
    if (mkdir(t, 0755) != 0) {
        s = kvq_err_set(err, KVQ_E_IO, "%s: cannot create: %s", path, strerror(errno));
        reg_del(t);
        free(t);
        return s;
    }
    *tmp_dir = t;
    return KVQ_OK;
}

kvq_status kvq_tmpdir_commit(const char *tmp_dir, const char *path, int overwrite,
                             kvq_output_owned_fn owned, const char *what, kvq_err *err)
{
    struct stat st;
    char *aside = NULL;
    if (lstat(path, &st) == 0) {
        kvq_status s = kvq_output_check(path, overwrite, owned, what, err);
        if (s)
            return s;
        /* "<path>.old.<pid>.<random>": not a temporary, so nothing removes it but us. */
        char *t = tmp_name_for(path);
        if (!t || !(aside = malloc(strlen(t) + 1))) {
            free(t);
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        }
        const size_t n = strlen(path);
        memcpy(aside, t, n);
        memcpy(aside + n, ".old.", 5);
        strcpy(aside + n + 5, t + n + 5);
        free(t);
        if (rename(path, aside) != 0) {
            s = kvq_err_set(err, KVQ_E_IO, "%s: cannot move the old output aside: %s", path,
                            strerror(errno));
            free(aside);
            return s;
        }
    }
    if (rename(tmp_dir, path) != 0) {
        kvq_status s = kvq_err_set(err, KVQ_E_IO, "%s: rename failed: %s", path, strerror(errno));
        if (aside)
            rename(aside, path); /* the old output back */
        free(aside);
        return s;
    }
    reg_del(tmp_dir);
    if (aside)
        rm_at(AT_FDCWD, aside, 0);
    free(aside);
    return KVQ_OK;
}
