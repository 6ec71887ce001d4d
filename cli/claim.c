/* claim.c — an output claimed by a command before it writes (cli.h): refused when it
 * is one of the command's inputs (the same file, a directory holding an input, or a
 * file inside an input directory) or
 * when an input is given twice, then locked until the process exits (kvq/util.h
 * "locks"), so that two runs never write one output at once. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"

#define MAX_CLAIMS 4
static kvq_lock claims[MAX_CLAIMS];
static int n_claims;

static void release_claims(void)
{
    for (int i = 0; i < n_claims; i++)
        kvq_lock_release(&claims[i]);
    n_claims = 0;
}

/* 1 when a and b name the same file (both exist). */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* 1 when `path` lies inside the existing directory `dir`. */
static int inside(const char *path, const char *dir)
{
    char rp[PATH_MAX], rd[PATH_MAX];
    struct stat sd;
    if (stat(dir, &sd) != 0 || !S_ISDIR(sd.st_mode) || !realpath(dir, rd))
        return 0;
    if (!realpath(path, rp)) { /* a new file: its folder's real path and its name */
        char parent[PATH_MAX];
        const char *slash = strrchr(path, '/');
        const size_t np = slash ? (size_t)(slash - path) : 0;
        if (np >= sizeof parent)
            return 0;
        memcpy(parent, slash ? path : ".", slash ? np : 1);
        parent[slash ? np : 1] = 0;
        if (slash && np == 0)
            strcpy(parent, "/");
        char rpar[PATH_MAX];
        if (!realpath(parent, rpar) ||
            snprintf(rp, sizeof rp, "%s/%s", rpar, slash ? slash + 1 : path) >= (int)sizeof rp)
            return 0;
    }
    const size_t n = strlen(rd);
    return !strncmp(rp, rd, n) && (rp[n] == '/' || (n == 1 && rd[0] == '/'));
}

int cli_claim_output(const char *out, const char *const *inputs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!inputs[i])
            continue;
        for (size_t j = 0; j < i; j++)
            if (inputs[j] && same_file(inputs[i], inputs[j]))
                return cli_failf(2, "%s: given twice as an input (as '%s' and '%s')",
                                 inputs[i], inputs[j], inputs[i]);
        if (same_file(out, inputs[i]) || inside(inputs[i], out) || inside(out, inputs[i]))
            return cli_failf(2, "%s: the output is also an input of this command ('%s'); "
                             "choose another output", out, inputs[i]);
    }
    if (cli_dist_rank() != 0) /* rank 0 writes, and holds the lock */
        return 0;
    if (n_claims == MAX_CLAIMS)
        return cli_failf(1, "%s: too many outputs", out);
    kvq_err e = {0};
    if (kvq_lock_output(out, &claims[n_claims], &e) != KVQ_OK)
        return cli_fail(&e);
    if (n_claims++ == 0)
        atexit(release_claims);
    return 0;
}
