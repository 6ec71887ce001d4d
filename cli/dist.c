/*
 * dist.c — the kvq binary's process group (kvq/dist.h) over MPI.
 *
 * MPI is initialized only when kvq was started by a launcher (mpirun / mpiexec set
 * OMPI_COMM_WORLD_SIZE, PMIx and PMI launchers such as srun set PMIX_RANK or PMI_RANK);
 * a plain `kvq ...` never touches MPI. Built without MPI (`make MPI=0`, or no mpicc /
 * ompi-c found), kvq refuses to run as one of several launched processes, since each
 * would do the whole job and they would race on the outputs.
 *
 * Only rank 0 prints: the other ranks' stdout goes to /dev/null and their stderr shows
 * errors only (the library agrees on errors, so rank 0 prints "rank R of N: ..." for
 * any rank).
 */
#include "cli/cli.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KVQ_HAVE_MPI
#include <mpi.h>
#endif

static kvq_dist g_dist;
static int g_active;   /* MPI was initialized by us */

static int launched_size(void)
{
    const char *v = getenv("OMPI_COMM_WORLD_SIZE");
    if (!v)
        v = getenv("PMI_SIZE");
    if (!v)
        v = getenv("PMIX_SIZE");
    if (v)
        return atoi(v);
    return getenv("PMIX_RANK") || getenv("PMI_RANK") ? 1 : 0;
}

static int launched_rank(void)
{
    const char *v = getenv("OMPI_COMM_WORLD_RANK");
    if (!v)
        v = getenv("PMIX_RANK");
    if (!v)
        v = getenv("PMI_RANK");
    return v ? atoi(v) : 0;
}

#ifdef KVQ_HAVE_MPI
/* (launched_rank serves the build without MPI) */
static int (*const unused_rank)(void) __attribute__((unused)) = launched_rank;
#define MPI_CHUNK ((size_t)1 << 30)
static MPI_Comm g_comm;

static kvq_status mpi_fail(kvq_err *err, const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, msg, &n);
    return kvq_err_set(err, KVQ_E_IO, "MPI %s failed: %s", what, msg);
}

/* Waits for a nonblocking operation, sleeping between tests: a rank waiting for rank 0
 * (which runs the moments, the profile, the merge and the writes alone) must not spin
 * on a CPU that rank 0 or another rank on the machine needs, as blocking MPI calls do. */
static int wait_req(MPI_Request *req)
{
    long ns = 20000;
    for (;;) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done)
            return rc;
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 5000000)
            ns *= 2;
    }
}

static kvq_status mpi_barrier(void *impl, kvq_err *err)
{
    MPI_Request req;
    int rc = MPI_Ibarrier(g_comm, &req);
    if (rc == MPI_SUCCESS)
        rc = wait_req(&req);
    return rc == MPI_SUCCESS ? KVQ_OK : mpi_fail(err, "barrier", rc);
}

static kvq_status mpi_bcast(void *impl, void *buf, size_t n, kvq_err *err)
{
    for (size_t at = 0; at < n; at += MPI_CHUNK) {
        int c = (int)(n - at < MPI_CHUNK ? n - at : MPI_CHUNK);
        MPI_Request req;
        int rc = MPI_Ibcast((char *)buf + at, c, MPI_BYTE, 0, g_comm, &req);
        if (rc == MPI_SUCCESS)
            rc = wait_req(&req);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, "broadcast", rc);
    }
    return KVQ_OK;
}

/* Sizes first (MPI_Gather), then each rank's bytes to rank 0 in rank order. */
static kvq_status mpi_gather(void *impl, const void *buf, size_t n, uint8_t **all, size_t *sizes,
                             kvq_err *err)
{
    const int rank = g_dist.rank, size = g_dist.size;
    uint64_t mine = n, *got = rank == 0 ? calloc((size_t)size, sizeof *got) : NULL;
    MPI_Request req;
    int rc = MPI_Igather(&mine, 1, MPI_UINT64_T, got, 1, MPI_UINT64_T, 0, g_comm, &req);
    if (rc == MPI_SUCCESS)
        rc = wait_req(&req);
    *all = NULL;
    if (rc != MPI_SUCCESS) {
        free(got);
        return mpi_fail(err, "gather", rc);
    }
    if (rank != 0) {
        for (size_t at = 0; at < n; at += MPI_CHUNK) {
            int c = (int)(n - at < MPI_CHUNK ? n - at : MPI_CHUNK);
            rc = MPI_Isend((const char *)buf + at, c, MPI_BYTE, 0, 7, g_comm, &req);
            if (rc != MPI_SUCCESS || (rc = wait_req(&req)) != MPI_SUCCESS)
                return mpi_fail(err, "send", rc);
        }
        return KVQ_OK;
    }
    size_t total = 0;
    for (int r = 0; r < size; r++)
        total += (sizes[r] = (size_t)got[r]);
    free(got);
    uint8_t *out = malloc(total ? total : 1);
    if (!out) /* cannot receive: stop everyone rather than hang them */
        g_dist.abort(impl, 1, "kvq: rank 0: out of memory gathering results");
    if (n) /* (buf may be NULL when this rank has nothing) */
        memcpy(out, buf, n);
    size_t base = n;
    for (int r = 1; r < size; r++) {
        for (size_t at = 0; at < sizes[r]; at += MPI_CHUNK) {
            int c = (int)(sizes[r] - at < MPI_CHUNK ? sizes[r] - at : MPI_CHUNK);
            rc = MPI_Irecv(out + base + at, c, MPI_BYTE, r, 7, g_comm, &req);
            if (rc == MPI_SUCCESS)
                rc = wait_req(&req);
            if (rc != MPI_SUCCESS) {
                free(out);
                return mpi_fail(err, "receive", rc);
            }
        }
        base += sizes[r];
    }
    *all = out;
    return KVQ_OK;
}

static void mpi_abort(void *impl, int code, const char *msg)
{
    if (msg && *msg)
        fprintf(stderr, "%s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}
#endif

int cli_dist_init(int *argc, char ***argv)
{
    const int n = launched_size();
#ifdef KVQ_HAVE_MPI
    if (n == 0)
        return 0;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return cli_failf(2, "MPI_Init failed (launched by mpirun/srun)");
    g_active = 1;
    MPI_Comm_dup(MPI_COMM_WORLD, &g_comm);
    MPI_Comm_rank(g_comm, &g_dist.rank);
    MPI_Comm_size(g_comm, &g_dist.size);
    g_dist.barrier = mpi_barrier;
    g_dist.bcast = mpi_bcast;
    g_dist.gather = mpi_gather;
    g_dist.abort = mpi_abort;
#else
    (void)argc;
    (void)argv;
    if (n <= 1)
        return 0;
    if (launched_rank() == 0)
        fprintf(stderr, "kvq: started as %d processes by mpirun/srun, but this kvq was built "
                        "without MPI (kvq version says 'mpi: off'); install libopenmpi-dev and "
                        "rebuild, or run one process\n", n);
    return 2;
#endif
    if (g_dist.rank != 0 && g_dist.size > 1) {
        if (!freopen("/dev/null", "w", stdout))
            return 2;
    }
    return 0;
}

void cli_dist_finish(void)
{
#ifdef KVQ_HAVE_MPI
    if (g_active) {
        MPI_Comm_free(&g_comm);
        MPI_Finalize();
    }
#endif
    g_active = 0;
}

const kvq_dist *cli_dist(void) { return g_dist.size > 1 ? &g_dist : NULL; }
int cli_dist_rank(void) { return g_dist.size > 1 ? g_dist.rank : 0; }

void cli_dist_version(char *buf, size_t cap)
{
#ifdef KVQ_HAVE_MPI
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0, major = 0, minor = 0;
    MPI_Get_library_version(lib, &n);
    MPI_Get_version(&major, &minor);
    char *nl = strpbrk(lib, ",\n");
    if (nl)
        *nl = 0;
    snprintf(buf, cap, "on (%s, MPI %d.%d; used under mpirun/srun)", lib, major, minor);
#else
    snprintf(buf, cap, "off (built without MPI)");
#endif
}

/* Testing aid: KVQ_TEST_KILL="RANK:N[:STAGE]" makes rank RANK kill itself (SIGKILL, as a
 * lost node would) once the progress of STAGE (default "fit": heads; "capture": tokens
 * of its share; "profile": layers) has reached N. */
void cli_dist_test_kill(const char *what, uint64_t done)
{
    static int parsed, rank = -1;
    static long n;
    static char stage[32] = "fit";
    if (!parsed) {
        const char *v = getenv("KVQ_TEST_KILL");
        parsed = 1;
        if (v && sscanf(v, "%d:%ld:%31s", &rank, &n, stage) < 2)
            rank = -1;
    }
    if (rank >= 0 && rank == cli_dist_rank() && !strncmp(what, stage, strlen(stage)) &&
        (long)done >= n)
        raise(SIGKILL);
}
