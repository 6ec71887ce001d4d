/*
 * kvq/util.h — checked parsing, growable arrays and strings, JSON strings, file
 * mapping, atomic output, small helpers.
 *
 * These sit at the bottom of the dependency graph and are used by every stage
 * and by the CLI.
 */
#ifndef KVQ_UTIL_H
#define KVQ_UTIL_H

#include <stdio.h>
#include "kvq/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- checked number parsing -------------------------------------------------
 * Whole-string parsers: leading/trailing garbage, empty strings, overflow and
 * values outside [min, max] are KVQ_E_INVALID_ARG (message names the text). */
kvq_status kvq_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out, kvq_err *err);
kvq_status kvq_parse_f64(const char *s, double min, double max, double *out, kvq_err *err);
/* "0,2,5-7" -> sorted unique ints in [0, limit). *out is malloc'd (free()). */
kvq_status kvq_parse_index_list(const char *s, int64_t limit, int32_t **out, size_t *n,
                                kvq_err *err);

/* ---- overflow-checked size arithmetic (return 0 on overflow) ---------------- */
static inline int kvq_size_mul(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline int kvq_size_add(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* ---- growable arrays ------------------------------------------------------------
 * kvq_grow: makes room for `need` items of `size` bytes in *items, whose capacity is
 * *cap items, doubling it (from 16 at least) until it holds `need`. Returns 0, or -1 on
 * size overflow or out of memory, with *items and *cap unchanged.
 * kvq_resize: reallocates *p to n items of `size` bytes (at least one byte). Returns 0,
 * or -1 on size overflow or out of memory, with *p unchanged. */
int kvq_grow(void **items, size_t *cap, size_t need, size_t size);
int kvq_resize(void **p, size_t n, size_t size);

/* ---- growable string ------------------------------------------------------------- */
typedef struct kvq_strbuf {
    char *s;    /* [cap]; NUL-terminated once anything was appended; NULL when empty */
    size_t len, cap;
    int oom;    /* an append failed: the text is incomplete (later appends do nothing) */
} kvq_strbuf;
void kvq_sb_put(kvq_strbuf *b, const void *p, size_t n); /* n bytes, may hold NULs */
void kvq_sb_puts(kvq_strbuf *b, const char *s);
void kvq_sb_printf(kvq_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvq_sb_json_str(kvq_strbuf *b, const char *s); /* as kvq_json_write_str */
void kvq_sb_free(kvq_strbuf *b);                    /* back to {0} */

/* ---- JSON strings -----------------------------------------------------------------
 * Writes s as a JSON string literal: quote and backslash escaped, \b \f \n \r \t,
 * other control characters and DEL as \u00XX, other bytes as they are. A string that
 * is not valid UTF-8 (which would make the file unreadable) has its bytes >= 0x80
 * written as '?'. s = NULL writes null. */
void kvq_json_write_str(FILE *f, const char *s);

/* ---- small helpers ----------------------------------------------------------------- */
/* qsort comparators, ascending. */
int kvq_cmp_i32(const void *a, const void *b);
int kvq_cmp_i64(const void *a, const void *b);
/* "dir/name", malloc'd (free()); NULL when out of memory. */
char *kvq_path_join(const char *dir, const char *name);
/* 1 when s begins with prefix. */
int kvq_has_prefix(const char *s, const char *prefix);

/* ---- UTF-8 ---------------------------------------------------------------- */
/* 1 if s[0..n) is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int kvq_utf8_valid(const char *s, size_t n);

/* ---- read-only file mapping ----------------------------------------------- */
typedef struct kvq_map {
    const uint8_t *data; /* NULL for an empty file */
    size_t size;
} kvq_map;
/* Maps `path` read-only. Errors: KVQ_E_NOT_FOUND, KVQ_E_IO. */
kvq_status kvq_map_file(const char *path, kvq_map *m, kvq_err *err);
/* Opens path for reading when it is a regular file (*fd, *st filled); anything else (a
 * FIFO, a device, a directory) is refused at once with KVQ_E_IO "PATH: not a regular
 * file (a FIFO)", without waiting on it. Used by kvq_map_file and kvq_read_file. */
struct stat;
kvq_status kvq_open_regular(const char *path, int *fd, struct stat *st, kvq_err *err);
void kvq_unmap(kvq_map *m); /* safe on a zeroed map */

/* Reads a whole file into a malloc'd buffer (NUL-terminated for convenience). */
kvq_status kvq_read_file(const char *path, uint8_t **data, size_t *size, kvq_err *err);

/* ---- output: atomic replacement, ownership, temporaries (common/output.c) ------
 * Output goes to "<path>.tmp.<pid>.<random>" in the same directory and is renamed over
 * `path` only by kvq_atomic_commit, so readers never see a half-written file.
 * kvq_atomic_abort (or a failed commit) removes the temporary. Every temporary is listed
 * in a process-wide registry while it exists, so kvq_output_remove_temporaries (safe to
 * call from a signal handler) can remove them; creating one also removes the stale
 * temporaries of the same output that a killed process left (their pid is gone). */
typedef struct kvq_atomic_file {
    FILE *fp;          /* write here */
    char *path;        /* final name */
    char *tmp_path;    /* temporary name */
} kvq_atomic_file;
/* overwrite = 0: fail with KVQ_E_EXISTS if `path` exists. */
kvq_status kvq_atomic_open(const char *path, int overwrite, kvq_atomic_file *af, kvq_err *err);
kvq_status kvq_atomic_commit(kvq_atomic_file *af, kvq_err *err); /* flush, fsync, rename */
void kvq_atomic_abort(kvq_atomic_file *af);                      /* safe after commit */

/* 1 when `path` holds a kvq output of one kind (a capture directory, an artifact, a
 * moments file): the only things --force may replace. */
typedef int (*kvq_output_owned_fn)(const char *path);

/* Checks, before any expensive work, that `path` can become the output:
 *   - it exists and overwrite = 0: KVQ_E_EXISTS "PATH: already exists (use --force ...)";
 *   - it exists, overwrite = 1 and owned is NULL or owned(path) = 0: KVQ_E_EXISTS
 *     "PATH: exists and is not WHAT; kvq replaces only its own outputs";
 *   - a file cannot be created next to it (missing folder, no permission): KVQ_E_IO
 *     "PATH: cannot create: REASON" (a probe file is created and removed).
 * Removes the stale temporaries of `path` (kvq_output_clean_stale). */
kvq_status kvq_output_check(const char *path, int overwrite, kvq_output_owned_fn owned,
                            const char *what, kvq_err *err);

/* Directories: create "<path>.tmp.<pid>.<random>/" (after kvq_output_check), fill it,
 * then commit: an existing `path` (overwrite = 1 and owned(path)) is first renamed
 * aside, the new directory renamed into place, and only then the old one removed; a
 * failed rename puts the old one back, so no failure loses both. *tmp_dir is malloc'd. */
kvq_status kvq_tmpdir_create(const char *path, int overwrite, kvq_output_owned_fn owned,
                             const char *what, char **tmp_dir, kvq_err *err);
kvq_status kvq_tmpdir_commit(const char *tmp_dir, const char *path, int overwrite,
                             kvq_output_owned_fn owned, const char *what, kvq_err *err);
/* Removes a file or directory tree (best effort; for kvq's own temporaries and outputs
 * only) and drops it from the temporaries registry. */
void kvq_rmtree(const char *path);

/* Removes "<path>.tmp.<pid>.<random>" entries whose process no longer exists. */
void kvq_output_clean_stale(const char *path);
/* Removes every temporary of `path` and every temporary "NAME.tmp.<pid>.<random>"
 * inside the directory inner_dir (may be NULL), but this process's, whether or not the
 * process that made it still runs: for a job of several processes (MPI ranks, maybe on
 * other machines, where a pid says nothing) that owns `path`. Returns how many. */
int kvq_output_clean_job(const char *path, const char *inner_dir);
/* Adds a path (a lock file) to the registry that kvq_output_remove_temporaries removes,
 * or drops it from it. */
void kvq_output_register(const char *path);
void kvq_output_unregister(const char *path);
/* Removes every registered temporary of this process. Async-signal-safe: meant for a
 * SIGINT/SIGTERM handler of the program (the library installs none). */
void kvq_output_remove_temporaries(void);

/* ---- locks: one process at a time (common/lock.c) ---------------------------------
 * flock(2) on a lock file, so the kernel drops it when the process ends (kill -9
 * included) and no lock is ever left stuck. The holder writes "pid P on host H since
 * T: COMMAND" into the file; a second taker fails at once with KVQ_E_EXISTS "WHAT is
 * in use by another kvq run (HOLDER) ...". Release removes the file. */
typedef struct kvq_lock {
    int fd;     /* -1 when not held */
    char *path;
} kvq_lock;
kvq_status kvq_lock_take(const char *lock_path, const char *what, kvq_lock *lk, kvq_err *err);
/* The lock of an output being written: "<out_path>.lock" next to it. */
kvq_status kvq_lock_output(const char *out_path, kvq_lock *lk, kvq_err *err);
void kvq_lock_release(kvq_lock *lk); /* safe on a lock not held */
/* This process's command line (/proc/self/cmdline) into buf, the arguments joined by
 * spaces and quoted for a POSIX shell where needed, line breaks made spaces, cut at cap;
 * "" when it cannot be read. */
void kvq_self_command(char *buf, size_t cap);

/* ---- hashing ------------------------------------------------------------------ */
/* 64-bit FNV-1a, for provenance hashes (corpus, tokens). Not cryptographic. */
uint64_t kvq_fnv1a64(const void *data, size_t n, uint64_t seed);
#define KVQ_FNV1A64_INIT 0xcbf29ce484222325ULL
/* XXH64 (common/xxh64.c), one shot or streamed: the checksum of intermediates
 * (capture layer files, moments files). Not cryptographic. */
typedef struct kvq_xxh64_state {
    uint64_t v[4], seed, total;
    uint8_t buf[32];
    uint32_t n_buf;
} kvq_xxh64_state;
void kvq_xxh64_init(kvq_xxh64_state *s, uint64_t seed);
void kvq_xxh64_update(kvq_xxh64_state *s, const void *data, size_t n);
uint64_t kvq_xxh64_digest(const kvq_xxh64_state *s);
uint64_t kvq_xxh64(const void *data, size_t n, uint64_t seed);
/* XXH64 (seed 0) of a regular file's bytes, read in pieces. */
kvq_status kvq_xxh64_file(const char *path, uint64_t *out, kvq_err *err);

/* ---- seeded random numbers ------------------------------------------------------
 * SplitMix64-seeded xoshiro256**: the same seed gives the same stream on every
 * platform. Every stage that samples takes a seed parameter and uses this. */
typedef struct kvq_rng {
    uint64_t s[4];
} kvq_rng;
void kvq_rng_seed(kvq_rng *r, uint64_t seed);
uint64_t kvq_rng_u64(kvq_rng *r);
double kvq_rng_uniform(kvq_rng *r);          /* [0, 1), 53 bits */
uint64_t kvq_rng_below(kvq_rng *r, uint64_t n); /* [0, n), unbiased; n > 0 */
double kvq_rng_normal(kvq_rng *r);           /* standard normal (Box-Muller) */

/* ---- time ------------------------------------------------------------------------ */
double kvq_now(void); /* monotonic seconds */

#ifdef __cplusplus
}
#endif
#endif /* KVQ_UTIL_H */
