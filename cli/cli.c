/* cli.c — error printing, callbacks and option helpers shared by subcommands. */
#include "cli/cli.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvq/util.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

static const char *g_command; /* the running subcommand, for the error prefix */

void cli_set_command(const char *name) { g_command = name; }

void cli_keep_freed_memory(void)
{
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

/* "kvq CMD: MSG" (MSG without a leading "CMD: " of its own), or "kvq: MSG" outside a
 * subcommand: one prefix style for every error. */
static void print_error(const char *msg)
{
    const size_t n = g_command ? strlen(g_command) : 0;
    if (!g_command) {
        fprintf(stderr, "kvq: %s\n", msg);
        return;
    }
    if (!strncmp(msg, g_command, n) && msg[n] == ':' && msg[n + 1] == ' ')
        msg += n + 2;
    fprintf(stderr, "kvq %s: %s\n", g_command, msg);
}

int cli_fail(const kvq_err *err)
{
    if (cli_dist_rank() != 0) /* errors are agreed: rank 0 prints it, naming the rank */
        return 1;
    print_error(err->msg[0] ? err->msg : kvq_status_str(err->status));
    return 1;
}

int cli_check_corpus(const char *spec)
{
    kvq_corpus *c = NULL;
    kvq_err e = {0};
    if (!spec)
        return 0;
    if (kvq_corpus_open(spec, NULL, &c, &e) == KVQ_OK) {
        kvq_corpus_free(c);
        return 0;
    }
    cli_fail(&e);
    return e.status == KVQ_E_INVALID_ARG ? 2 : 1;
}

int cli_failf(int code, const char *fmt, ...)
{
    if (cli_dist_rank() != 0)
        return code;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    print_error(buf);
    return code;
}

typedef struct cli_state {
    int verbose, quiet, tty, json;
    int live;               /* a terminal's progress line is open (no newline yet) */
    double t0;
    char last_what[64];
    double last_print;
} cli_state;

static cli_state g_state;

static void cli_log(void *user, kvq_log_level level, const char *msg)
{
    cli_state *s = user;
    if (level == KVQ_LOG_DEBUG && s->verbose < 2)
        return;
    if (level < KVQ_LOG_ERROR && cli_dist_rank() != 0) /* rank 0 speaks for the group */
        return;
    if (level == KVQ_LOG_INFO && s->quiet)
        return;
    static const char *const tag[] = {"debug: ", "", "warning: ", "error: "};
    if (s->live) /* ends the live line; its task's rate and ETA go on */
        fputc('\n', stderr), s->live = 0;
    fprintf(stderr, "kvq: %s%s\n", tag[level], msg);
}

/* One progress line as JSON (cli_progress_json). */
static int prog_json(const char *what, uint64_t done, uint64_t total, double el, double rate,
                     int finished)
{
    fprintf(stderr, "{\"progress\": ");
    kvq_json_write_str(stderr, what);
    fprintf(stderr, ", \"done\": %llu, \"total\": ", (unsigned long long)done);
    if (total)
        fprintf(stderr, "%llu", (unsigned long long)total);
    else
        fprintf(stderr, "null");
    fprintf(stderr, ", \"elapsed_s\": %.3f, \"eta_s\": ", el);
    if (finished)
        fprintf(stderr, "0");
    else if (total && rate > 0)
        fprintf(stderr, "%.1f", (double)(total - done) / rate);
    else
        fprintf(stderr, "null");
    fprintf(stderr, "}\n");
    fflush(stderr);
    return 0;
}

static int cli_prog(void *user, const char *what, uint64_t done, uint64_t total)
{
    cli_state *s = user;
    cli_dist_test_kill(what, done);
    if (s->quiet || cli_dist_rank() != 0)
        return 0;
    double now = kvq_now();
    if (strncmp(s->last_what, what, sizeof s->last_what - 1) != 0) {
        if (s->live)
            fputc('\n', stderr), s->live = 0;
        snprintf(s->last_what, sizeof s->last_what, "%s", what);
        s->t0 = now;
        s->last_print = 0;
    }
    int finished = total && done >= total;
    /* Terminals get a live line; logs get a line every 5 s and at the end; JSON a line
     * a second and at the end. */
    double every = s->json ? 1.0 : s->tty ? 0.2 : 5.0;
    if (!finished && now - s->last_print < every)
        return 0;
    s->last_print = now;
    double el = now - s->t0, rate = el > 0 ? (double)done / el : 0;
    if (s->json) {
        if (finished)
            s->last_what[0] = 0;
        return prog_json(what, done, total, el, rate, finished);
    }
    char eta[32] = "";
    if (total && rate > 0 && !finished)
        snprintf(eta, sizeof eta, ", ETA %.0fs", (double)(total - done) / rate);
    if (total)
        fprintf(stderr, "%skvq: %s %llu/%llu (%.0f%%, %.1f/s%s)%s", s->tty ? "\r" : "", what,
                (unsigned long long)done, (unsigned long long)total, 100.0 * done / total, rate,
                eta, s->tty && !finished ? "" : "\n");
    else
        fprintf(stderr, "%skvq: %s %llu (%.1f/s)%s", s->tty ? "\r" : "", what,
                (unsigned long long)done, rate, s->tty ? "" : "\n");
    s->live = s->tty && !finished;
    if (finished)
        s->last_what[0] = 0;
    fflush(stderr);
    return 0;
}

kvq_callbacks cli_callbacks(int verbose, int quiet)
{
    g_state.verbose = verbose;
    g_state.quiet = quiet;
    g_state.tty = isatty(2);
    g_state.json = 0;
    kvq_callbacks cb = {cli_log, cli_prog, &g_state};
    return cb;
}

void cli_progress_json(void) { g_state.json = 1; }

void cli_eval_json_head(const char *model_path, const char *spec)
{
    char cmd[4096];
    kvq_self_command(cmd, sizeof cmd);
    printf("{\"command\": ");
    kvq_json_write_str(stdout, cmd);
    printf(", \"model\": ");
    kvq_json_write_str(stdout, model_path);
    printf(", \"corpus\": ");
    kvq_json_write_str(stdout, spec);
}

int cli_opt_i64(const char *cmd, const char *opt, const char *val, int64_t min, int64_t max,
                int64_t *out)
{
    kvq_err e = {0};
    if (!val) {
        fprintf(stderr, "kvq %s: %s needs a value\n", cmd, opt);
        return 2;
    }
    if (kvq_parse_i64(val, min, max, out, &e) != KVQ_OK) {
        fprintf(stderr, "kvq %s: %s: %s\n", cmd, opt, e.msg);
        return 2;
    }
    return 0;
}

int cli_opt_f64(const char *cmd, const char *opt, const char *val, double min, double max,
                double *out)
{
    kvq_err e = {0};
    if (!val) {
        fprintf(stderr, "kvq %s: %s needs a value\n", cmd, opt);
        return 2;
    }
    if (kvq_parse_f64(val, min, max, out, &e) != KVQ_OK) {
        fprintf(stderr, "kvq %s: %s: %s\n", cmd, opt, e.msg);
        return 2;
    }
    return 0;
}

int cli_is_help(const char *arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }

int32_t cli_default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    /* Under mpirun, the ranks on this machine share its CPUs. */
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long l = local ? atol(local) : 1;
    if (l > 1 && n > 0)
        n = n / l > 0 ? n / l : 1;
    return n > 0 && n < 1024 ? (int32_t)n : 1;
}

const char *cli_today(void)
{
    static char buf[16];
    time_t t = time(NULL);
    const char *sde = getenv("SOURCE_DATE_EPOCH");
    int64_t v;
    if (sde && kvq_parse_i64(sde, 0, INT64_C(253402300799), &v, NULL) == KVQ_OK)
        t = (time_t)v;
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(buf, sizeof buf, "%Y-%m-%d", &tm))
        return NULL;
    return buf;
}
