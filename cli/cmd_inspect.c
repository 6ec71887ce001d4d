/* cmd_inspect.c — `kvq inspect PATH [--json]`: what a file is and what it holds.
 *
 * The kind is detected from the content, never the name: GGUF (magic "GGUF"), a .kvq
 * artifact (zstd skippable magic), safetensors (u64 header length, then '{'), or a
 * capture directory (a directory with capture.json). The text output is for people
 * and is compared byte for byte by tests/cli/inspect.sh; --json prints one document
 * for scripts, with everything the text shows. An artifact from `kvq fit` / `kvq
 * profile` also gets a summary of docs/format.md sections 9 and 10 ("fit" and
 * "thresholds" in the JSON). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/inspect.h"
#include "kvq/capture_dir.h"

static void inspect_usage(FILE *f)
{
    fprintf(f,
            "usage: kvq inspect PATH [--json]\n"
            "\n"
            "Describes a GGUF model, a safetensors file, a .kvq artifact or a capture\n"
            "directory (detected from the content): format and version, model identity\n"
            "and hyperparameters, tokenizer, method settings, metadata, and every tensor\n"
            "with its type and shape. GGUF shapes are in ne order (ne[0] contiguous).\n"
            "For an artifact from `kvq fit`: the fit's settings and its held-out\n"
            "attention-score error per layer against the plain-VQ reference; after\n"
            "`kvq profile`: the chosen thresholds and each knob's memory/quality table.\n"
            "\n"
            "options:\n"
            "  --json       one JSON document instead of text\n"
            "  -h, --help   this help\n");
}


/* ==========================================================================
 * detection and entry point
 * ========================================================================== */

typedef enum { KIND_UNKNOWN, KIND_GGUF, KIND_KVQ, KIND_SAFETENSORS } file_kind;

static file_kind detect(const uint8_t *b, size_t n)
{
    if (n >= 4 && !memcmp(b, "GGUF", 4))
        return KIND_GGUF;
    if (n >= 4 && b[0] == 0x5B && b[1] == 0x2A && b[2] == 0x4D && b[3] == 0x18)
        return KIND_KVQ;
    if (n >= 9 && b[8] == '{')
        return KIND_SAFETENSORS;
    return KIND_UNKNOWN;
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            inspect_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            inspect_usage(stderr);
            return cli_failf(2, "inspect: unknown option '%s'", argv[i]);
        } else if (path) {
            return cli_failf(2, "inspect: one PATH only ('%s' and '%s')", path, argv[i]);
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        inspect_usage(stderr);
        return 2;
    }

    struct stat sb;
    if (stat(path, &sb) != 0)
        return cli_failf(1, "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        char probe[4096];
        snprintf(probe, sizeof probe, "%s/%s", path, KVQ_CAPTURE_JSON);
        if (access(probe, F_OK) != 0)
            return cli_failf(1, "%s: a directory without %s (not a capture directory)", path,
                             KVQ_CAPTURE_JSON);
        return inspect_capture(path, json);
    }
    uint8_t head[16] = {0};
    size_t n = 0;
    int fd;
    kvq_err e = {0};
    if (kvq_open_regular(path, &fd, &sb, &e) != KVQ_OK) /* a FIFO: refused, not waited on */
        return cli_fail(&e);
    const ssize_t got = read(fd, head, sizeof head);
    close(fd);
    n = got > 0 ? (size_t)got : 0;
    switch (detect(head, n)) {
    case KIND_GGUF:
        return inspect_gguf(path, (uint64_t)sb.st_size, json);
    case KIND_KVQ:
        return inspect_kvq(path, (uint64_t)sb.st_size, json);
    case KIND_SAFETENSORS:
        return inspect_safetensors(path, (uint64_t)sb.st_size, json);
    case KIND_UNKNOWN:
        break;
    }
    if (n == 0)
        return cli_failf(1, "%s: empty file", path);
    return cli_failf(1, "%s: not a kvq file (unrecognized format: not GGUF, safetensors, a "
                     ".kvq artifact or a capture directory)", path);
}
