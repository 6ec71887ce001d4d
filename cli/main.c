/* main.c — the kvq binary: dispatches subcommands from a table. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"


static int cmd_help(int argc, char **argv);
static int cmd_version(int argc, char **argv);
int cmd_capture(int argc, char **argv); /* cmd_capture.c */
int cmd_inspect(int argc, char **argv); /* cmd_inspect.c */
int cmd_moments(int argc, char **argv); /* cmd_moments.c */
int cmd_fit(int argc, char **argv);     /* cmd_fit.c */
int cmd_profile(int argc, char **argv); /* cmd_profile.c */
int cmd_calibrate(int argc, char **argv); /* cmd_calibrate.c */
int cmd_run(int argc, char **argv);     /* cmd_run.c */
int cmd_eval(int argc, char **argv);    /* cmd_eval.c */
int cmd_card(int argc, char **argv);    /* cmd_card.c */

/* Keep in pipeline order; `kvq help` prints them as listed. */
static const cli_command commands[] = {
    {"capture", "record pre-RoPE Q, K, V per layer over a corpus (or merge captures)", cmd_capture},
    {"moments", "query second moments H and Cholesky factors from a capture", cmd_moments},
    {"fit", "fit key codebooks per layer and KV head and write the .kvq artifact", cmd_fit},
    {"profile", "profile LeanKV thresholds, PATS schedules and retrieval budgets into the artifact",
     cmd_profile},
    {"calibrate", "run capture, moments, fit and profile with defaults, resumably", cmd_calibrate},
    {"run", "generate text, with full or retrieval attention (--artifact)", cmd_run},
    {"eval", "perplexity and retrieval quality per selector and budget", cmd_eval},
    {"inspect", "describe a GGUF, safetensors, .kvq file or capture directory", cmd_inspect},
    {"card", "write a markdown model card for a .kvq artifact", cmd_card},
    {"version", "print the version and build configuration", cmd_version},
    {"help", "list commands, or show one command's help", cmd_help},
};
static const size_t n_commands = sizeof commands / sizeof commands[0];

static void usage(FILE *f)
{
    fprintf(f, "kvq %s — codebooks and calibration for retrieval-based KV-cache compression\n\n"
               "usage: kvq <command> [options]   (kvq <command> --help for details)\n\n"
               "commands:\n",
            kvq_version());
    for (size_t i = 0; i < n_commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nmodels: GGUF files or HF directories of the architectures\n"
               "  " KVQ_ARCH_LIST " (docs/models.md);\n"
               "  anything else is refused by name\n");
}

static const cli_command *find(const char *name)
{
    for (size_t i = 0; i < n_commands; i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

static int cmd_help(int argc, char **argv)
{
    if (argc >= 2) {
        const cli_command *c = find(argv[1]);
        if (!c || c->run == cmd_help)
            return c ? (usage(stdout), 0) : cli_failf(2, "unknown command '%s'", argv[1]);
        char *args[] = {argv[1], "--help", NULL};
        return c->run(2, args);
    }
    usage(stdout);
    return 0;
}

static int cmd_version(int argc, char **argv)
{
    const char *why = NULL;
    int cuda = kvq_cuda_available(&why);
    printf("kvq %s\n", kvq_version());
    printf("cuda: %s\n", cuda ? "available" : why);
    printf("cpu: avx2=%s avx512=%s\n", kvq_cpu_has_avx2() ? "yes" : "no",
           kvq_cpu_has_avx512() ? "yes" : "no");
    char mpi[256];
    cli_dist_version(mpi, sizeof mpi);
    printf("mpi: %s\n", mpi);
    return 0;
}

/* SIGINT, SIGTERM, SIGHUP: remove the temporaries of the outputs being written, then
 * die of the signal as before. */
static void on_signal(int sig)
{
    kvq_output_remove_temporaries();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_signal_cleanup(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        /* A signal the caller ignores (nohup) stays ignored. */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(sigs[i], &sa, NULL);
    }
}

/* Under mpirun with several ranks: the commands that split their work run on every
 * rank; the others run on rank 0 (the rest wait for it at MPI_Finalize). */
static int run_command(const cli_command *c, int argc, char **argv)
{
    const kvq_dist *d = cli_dist();
    const int split = c->run == cmd_capture || c->run == cmd_fit || c->run == cmd_calibrate ||
                      c->run == cmd_profile;
    if (!d || split)
        return c->run(argc, argv);
    if (d->rank != 0)
        return 0;
    if (c->run != cmd_help && c->run != cmd_version)
        fprintf(stderr, "kvq: %s does not split its work among ranks: rank 0 runs it alone\n",
                c->name);
    return c->run(argc, argv);
}

int main(int argc, char **argv)
{
    cli_thread_policy(argv); /* may re-execute kvq once, before anything else */
    install_signal_cleanup();
    int rc = cli_dist_init(&argc, &argv);
    if (rc)
        return rc;
    if (argc < 2) {
        cli_dist_finish();
        usage(stderr);
        return 2;
    }
    if (cli_is_help(argv[1])) {
        rc = cli_dist_rank() == 0 ? cmd_help(0, NULL) : 0;
        cli_dist_finish();
        return rc;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kvq %s\n", kvq_version());
        cli_dist_finish();
        return 0;
    }
    const cli_command *c = find(argv[1]);
    if (!c)
        rc = cli_failf(2, "unknown command '%s' (try 'kvq help')", argv[1]);
    else {
        cli_set_command(c->name);
        rc = run_command(c, argc - 1, argv + 1);
    }
    cli_dist_finish();
    return rc;
}
