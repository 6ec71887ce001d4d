/* thread_policy.c — the CLI's choice of how idle worker threads wait.
 *
 * Decode runs a few hundred short parallel regions per token (one per weight matrix),
 * and prefill one per product (model/forward_gemm.c; OpenBLAS is at one thread there).
 * With libgomp's default policy each idle worker spins before it sleeps, so on a busy
 * machine (another job, a compiler) a spinning thread holds a core while the thread it
 * waits for sits in the run queue, and `kvq run --threads 2` on SmolLM2 ran many times
 * slower than --threads 1 (figures and command: docs/BENCHMARKS.md "Under load",
 * bench/bench_load.sh). A passive wait gives the core back at once.
 *
 * libgomp reads OMP_WAIT_POLICY once, when it is loaded (before main), and has no call
 * to change it later; so the CLI sets it and executes itself again, once. A policy the
 * user set (OMP_WAIT_POLICY or GOMP_SPINCOUNT) is kept as it is (and stops the second
 * exec). On a quiet machine the passive wait costs decode speed (docs/BENCHMARKS.md
 * "Under load": the figures, and GOMP_SPINCOUNT=10000 for a dedicated machine). The
 * library itself never reads the environment. */
#include <stdlib.h>
#include <unistd.h>

#include "cli.h"

void cli_thread_policy(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
        return; /* the user's choice, or this is the second exec */
    if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    /* no /proc (or exec refused): go on with the default policy; OMP_WAIT_POLICY stays
     * set for any child, which is harmless */
}
