/* cli.h — shared plumbing for the kvq subcommands (one file per subcommand).
 *
 * The CLI is the only place that prints, reads the environment or exits. It uses
 * the installed headers (kvq.h) plus one internal header, kvq/util.h (checked parsing,
 * buffers, files), which it takes from the source tree. */
#ifndef KVQ_CLI_H
#define KVQ_CLI_H

#include <stdio.h>
#include "kvq.h"
#include "kvq/util.h" /* internal (not installed): the CLI is built in the source tree */

/* One subcommand: name, one-line summary, entry point (argv[0] is the name). */
typedef struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} cli_command;

/* The subcommand running (main.c sets it): errors then read "kvq CMD: ...". */
void cli_set_command(const char *name);
/* Prints "kvq CMD: <msg>" (err->msg; a leading "CMD: " of the message is not repeated)
 * to stderr and returns the exit code 1. */
int cli_fail(const kvq_err *err);
/* Checks a corpus spec before any model is read: 0, or prints the error and returns 2
 * for a malformed spec (an argument error: unknown kind, bad count, empty item) and 1
 * for a file that cannot be read. */
int cli_check_corpus(const char *spec);
/* The same with a printf message, returning the exit code given. */
int cli_failf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Callbacks that print warnings/info to stderr ("kvq: warning: ...") and a
 * single-line progress display (tokens, rate, ETA) when stderr is a terminal or
 * when progress lines are wanted (quiet = 0). */
kvq_callbacks cli_callbacks(int verbose, int quiet);
/* After cli_callbacks: progress as JSON lines on stderr instead (for --json):
 * {"progress": WHAT, "done": N, "total": N, "elapsed_s": S, "eta_s": S}, at most one a
 * second and one when a task finishes; eta_s is null while unknown. Not with quiet. */
void cli_progress_json(void);
/* The head of an eval's JSON object on stdout: {"command": the command line (for
 * `python -m kvq report`, docs/report.md), "model": model_path, "corpus": spec — the
 * caller prints the rest and the closing brace. */
void cli_eval_json_head(const char *model_path, const char *spec);

/* Option helpers. Each returns 0 on success or prints "kvq <cmd>: ..." and returns 2. */
int cli_opt_i64(const char *cmd, const char *opt, const char *val, int64_t min, int64_t max,
                int64_t *out);
int cli_opt_f64(const char *cmd, const char *opt, const char *val, double min, double max,
                double *out);
/* The number of online CPUs (1 if unknown): the --threads default of stages whose
 * output does not depend on the thread count. */
int32_t cli_default_threads(void);

/* Sets OMP_WAIT_POLICY=PASSIVE when the user set no policy and executes the program again
 * with the same argv (returns only when it did not: policy set, or exec failed). Worker
 * threads then sleep instead of spinning at every barrier (thread_policy.c). */
void cli_thread_policy(char **argv);

/* Keeps freed heap memory in the process (glibc: no mmap per large block, no trim):
 * for the stages that allocate and free per-job buffers of a few MiB from several
 * threads (the profile), where returning them to the kernel at every free and faulting
 * them in again cost ~18% of the CPU time. No effect elsewhere than glibc. */
void cli_keep_freed_memory(void);

/* Today's UTC date, "YYYY-MM-DD" (static buffer), for provenance.date; the time of
 * SOURCE_DATE_EPOCH (seconds) when that is set, as reproducible builds expect. */
const char *cli_today(void);

/* Claims the output `out` before anything is written (claim.c): exit code 2 when it is
 * one of the n inputs (the same file, a directory holding one, or a path inside an input
 * directory; NULL entries are
 * skipped) or an input is given twice; 1 when another process holds it ("OUT is in use
 * by another kvq run (pid ...)"); else 0, and rank 0 holds "OUT.lock" until exit. */
int cli_claim_output(const char *out, const char *const *inputs, size_t n);

/* Returns 1 if argv[i] is -h/--help. */
int cli_is_help(const char *arg);

/* ---- several processes (dist.c, docs/mpi.md) ------------------------------------- */
/* Initializes MPI when kvq was launched by mpirun/srun (0, or an exit code). */
int cli_dist_init(int *argc, char ***argv);
void cli_dist_finish(void);
/* The process group, NULL for one process; this process's rank (0 for one). */
const kvq_dist *cli_dist(void);
int cli_dist_rank(void);
/* "on (Open MPI v4.1.4, MPI 3.1; ...)" or "off (built without MPI)". */
void cli_dist_version(char *buf, size_t cap);
/* Testing aid (KVQ_TEST_KILL="RANK:HEADS"), called with each progress report. */
void cli_dist_test_kill(const char *what, uint64_t done);

#endif
