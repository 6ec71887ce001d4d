/* calibrate_work.c — the work directory and the output of a `kvq calibrate` run, held
 * by one run at a time and touched only when they are kvq's own:
 *
 *   - the output is locked ("OUT.lock" next to it) and the work directory too
 *     (WORK/.kvq-lock), with flock(2) (kvq/util.h "locks"): a second run stops before
 *     it changes anything, naming the holder; a killed run leaves no lock held;
 *   - the work directory carries the mark CALIB_WORK_MARKER, written when calibrate
 *     creates it; a directory without it is used only when it is empty;
 *   - an existing output is replaced without --force only when it holds the bytes this
 *     work directory last published (CALIB_PUBLISHED) or the ones it would publish. */
#include "kvq/calibrate.h"

#include <errno.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq/util.h"
#include "pipeline/calibrate_ctx.h"

static const char marker_text[] = CALIB_WORK_FORMAT "\n";

/* 64-bit FNV-1a of a file's bytes; 0 with *ok = 0 when it cannot be read. */
static uint64_t file_hash(const char *path, int *ok)
{
    uint8_t *d = NULL;
    size_t n = 0;
    *ok = kvq_read_file(path, &d, &n, NULL) == KVQ_OK;
    const uint64_t h = *ok ? kvq_fnv1a64(d, n, KVQ_FNV1A64_INIT) : 0;
    free(d);
    return h;
}

/* 1 when the files at a and b hold the same bytes. */
static int same_bytes(const char *a, const char *b)
{
    uint8_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    const int same = kvq_read_file(a, &x, &nx, NULL) == KVQ_OK &&
                     kvq_read_file(b, &y, &ny, NULL) == KVQ_OK && nx == ny && !memcmp(x, y, nx);
    free(x);
    free(y);
    return same;
}

/* An existing output that this work directory did not make needs --force. */
static kvq_status check_replace(const calib_ctx *c, const char *out_path, const char *final,
                                kvq_err *err)
{
    struct stat st;
    if (c->p->force || lstat(out_path, &st) != 0)
        return KVQ_OK;
    char *rec = kvq_path_join(c->work, CALIB_PUBLISHED);
    uint8_t *text = NULL;
    size_t n = 0;
    int ok = 0, mine = 0;
    const uint64_t h = file_hash(out_path, &ok);
    if (rec && ok && kvq_read_file(rec, &text, &n, NULL) == KVQ_OK) {
        char want[32];
        snprintf(want, sizeof want, "%016" PRIx64 "\n", h);
        mine = n == strlen(want) && !memcmp(text, want, n);
    }
    free(text);
    free(rec);
    if (mine || same_bytes(out_path, final))
        return KVQ_OK;
    return kvq_err_set(err, KVQ_E_EXISTS, "%s: exists and is not the artifact that the work "
                       "directory %s last wrote; calibrate replaces it only with --force",
                       out_path, c->work);
}

/* The work directory's state: 1 marked, 0 empty (but for the lock file and the mark's
 * temporary: another run is making it, or was killed making it), -1 neither
 * (*first: its first entry, malloc'd), -2 missing. */
static int work_state(const char *work, char **first)
{
    *first = NULL;
    DIR *d = opendir(work);
    if (!d)
        return -2;
    int state = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
            !strcmp(e->d_name, CALIB_WORK_LOCK) || /* a run's lock, or its mark being written */
            !strncmp(e->d_name, CALIB_WORK_MARKER ".tmp.", sizeof CALIB_WORK_MARKER + 4))
            continue;
        if (!strcmp(e->d_name, CALIB_WORK_MARKER)) {
            state = 1;
            break;
        }
        if (!*first)
            *first = strdup(e->d_name);
        state = -1;
    }
    closedir(d);
    return state;
}

/* Writes the mark into a work directory that has none. */
static kvq_status write_marker(const char *path, kvq_err *err)
{
    if (access(path, F_OK) == 0)
        return KVQ_OK;
    kvq_atomic_file af;
    kvq_status st = kvq_atomic_open(path, 1, &af, err);
    if (st)
        return st;
    if (fwrite(marker_text, 1, sizeof marker_text - 1, af.fp) != sizeof marker_text - 1) {
        kvq_atomic_abort(&af);
        return kvq_err_set(err, KVQ_E_IO, "%s: write failed (%zu bytes): %s", path,
                           sizeof marker_text - 1, strerror(errno));
    }
    return kvq_atomic_commit(&af, err);
}

kvq_status calib_claim(calib_ctx *c, const char *out_path, const char *final, kvq_err *err)
{
    kvq_status st;
    if ((st = kvq_lock_output(out_path, &c->out_lock, err)) ||
        (st = check_replace(c, out_path, final, err)))
        return st;
    struct stat sb;
    if (stat(c->work, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return kvq_err_set(err, KVQ_E_EXISTS, "%s: exists and is not a directory", c->work);
    char *first = NULL;
    int state = work_state(c->work, &first);
    if (state == -2) {
        if (mkdir(c->work, 0777) == 0)
            c->created_work = 1;
        else if (errno != EEXIST)
            return kvq_err_set(err, KVQ_E_IO, "%s: cannot create the work directory: %s",
                               c->work, strerror(errno));
        state = work_state(c->work, &first);
    }
    if (state == -1) {
        st = kvq_err_set(err, KVQ_E_EXISTS, "%s: not a kvq work directory (no %s mark, and it "
                         "holds '%s'); calibrate uses only a directory it made or an empty "
                         "one: choose another --work or remove it", c->work, CALIB_WORK_MARKER,
                         first ? first : "?");
        free(first);
        return st;
    }
    free(first);
    char *lock = kvq_path_join(c->work, CALIB_WORK_LOCK);
    char *mark = kvq_path_join(c->work, CALIB_WORK_MARKER);
    if (!lock || !mark)
        st = kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory");
    else if (!(st = kvq_lock_take(lock, c->work, &c->work_lock, err)))
        st = write_marker(mark, err);
    free(lock);
    free(mark);
    return st;
}

kvq_status calib_note_published(const calib_ctx *c, const char *out_path, kvq_err *err)
{
    int ok = 0;
    const uint64_t h = file_hash(out_path, &ok);
    if (!ok)
        return kvq_err_set(err, KVQ_E_IO, "%s: cannot read back what was written", out_path);
    char text[32];
    snprintf(text, sizeof text, "%016" PRIx64 "\n", h);
    char *rec = kvq_path_join(c->work, CALIB_PUBLISHED);
    if (!rec)
        return kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory");
    kvq_atomic_file af;
    kvq_status st = kvq_atomic_open(rec, 1, &af, err);
    if (!st && fwrite(text, 1, strlen(text), af.fp) != strlen(text)) {
        kvq_atomic_abort(&af);
        st = kvq_err_set(err, KVQ_E_IO, "%s: write failed (%zu bytes): %s", rec, strlen(text),
                         strerror(errno));
    } else if (!st) {
        st = kvq_atomic_commit(&af, err);
    }
    free(rec);
    return st;
}

void calib_release(calib_ctx *c, int remove_work)
{
    if (remove_work && c->work) {
        char *mark = kvq_path_join(c->work, CALIB_WORK_MARKER);
        if (mark)
            unlink(mark);
        free(mark);
    }
    kvq_lock_release(&c->work_lock);
    if (remove_work && c->work)
        rmdir(c->work); /* only when empty: nothing but what this run made */
    kvq_lock_release(&c->out_lock);
}
