/* describe_artifact.c — reads a .kvq artifact through kvq's stable API alone
 * (kvq/artifact.h; docs/api.md): its description as JSON, then, with LAYER and
 * KV_HEAD, that codebook's values, one per line. Built against an installed kvq with
 *
 *   cc describe_artifact.c $(pkg-config --cflags --libs kvq) -o describe_artifact
 *
 * (with a PREFIX outside the loader's path, add -Wl,-rpath,PREFIX/lib or set
 * LD_LIBRARY_PATH=PREFIX/lib to run it) and run as
 *
 *   describe_artifact ARTIFACT.kvq [LAYER KV_HEAD]
 *
 * The description goes into a buffer this program owns: asked for its length first,
 * then written. Exit 1 with kvq's message when the file is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvq.h>

static int fail(const kvq_err *e)
{
    fprintf(stderr, "describe_artifact: %s\n", e->msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 4) {
        fprintf(stderr, "usage: describe_artifact ARTIFACT.kvq [LAYER KV_HEAD]\n");
        return 2;
    }
    kvq_err e = {0};
    kvq_artifact *a = NULL;
    if (kvq_artifact_open(argv[1], &a, &e) != KVQ_OK)
        return fail(&e);
    size_t len = 0;
    char *buf = NULL;
    int rc = 0;
    if (kvq_artifact_describe_json(a, NULL, 0, &len, &e) != KVQ_OK || !(buf = malloc(len + 1)) ||
        kvq_artifact_describe_json(a, buf, len + 1, NULL, &e) != KVQ_OK) {
        rc = buf ? fail(&e) : (fprintf(stderr, "describe_artifact: out of memory\n"), 1);
    } else {
        printf("%s\n", buf);
    }
    if (!rc && argc == 4) {
        kvq_artifact_tensor t;
        if (kvq_artifact_codebook(a, atoi(argv[2]), atoi(argv[3]), -1, &t, &e) != KVQ_OK ||
            strcmp(t.dtype, "F32") != 0) {
            rc = fail(&e);
        } else {
            for (size_t i = 0; i < t.nbytes / 4; i++) {
                float v;
                memcpy(&v, (const char *)t.data + 4 * i, 4); /* may be unaligned */
                printf("%.9g\n", v);
            }
        }
    }
    free(buf);
    kvq_artifact_close(a);
    return rc;
}
