/* fuzz_hf_config.c — libFuzzer target for the HF config.json and
 * model.safetensors.index.json parsing in model/model_hf.c.
 *
 * The parser is reachable only through kvq_model_open on a directory, so each input is
 * written into a fresh temporary directory: the bytes up to the first NUL as
 * config.json and, when there is a NUL, the rest as model.safetensors.index.json. There
 * are no weights, so the open must fail, with a documented status and a message that
 * names the directory; a config that passes every check reaches the shard lookup and
 * fails there with KVQ_E_NOT_FOUND (or the safetensors reader's error for a shard name
 * that is one of the two files). Slower than the in-memory targets (a directory per
 * input). Also built as a plain corpus replayer (tests/fuzz/replay_main.c). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvq/model.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static void write_file(const char *dir, const char *name, const uint8_t *data, size_t size)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f);
    CHECK(size == 0 || fwrite(data, 1, size, f) == size);
    CHECK(fclose(f) == 0);
}

static void remove_file(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    char dir[400];
    snprintf(dir, sizeof dir, "%s/kvq-fuzz-hf-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(dir) != NULL);
    const uint8_t *nul = memchr(data, 0, size);
    const size_t cfg_len = nul ? (size_t)(nul - data) : size;
    write_file(dir, "config.json", data, cfg_len);
    if (nul)
        write_file(dir, "model.safetensors.index.json", nul + 1, size - cfg_len - 1);

    kvq_model_params p = kvq_model_params_default();
    kvq_model *m = (kvq_model *)dir; /* must be overwritten */
    kvq_err err = {0};
    const kvq_status st = kvq_model_open(dir, &p, &m, &err);
    if (st == KVQ_OK) { /* only if a shard name made one of the files a model */
        const kvq_model_config *c = kvq_model_config_get(m);
        CHECK(c->n_layers >= 1 && c->n_heads >= 1 && c->n_kv_heads >= 1);
        CHECK(c->n_heads % c->n_kv_heads == 0 && c->head_dim % 2 == 0);
        kvq_model_close(m);
    } else {
        CHECK(m == NULL && err.status == st && strncmp(err.msg, dir, strlen(dir)) == 0);
        /* format errors (200-210) include the safetensors reader's, for a shard name
           that is config.json or the index itself */
        CHECK(st == KVQ_E_NOT_FOUND || st == KVQ_E_IO || st == KVQ_E_UNSUPPORTED ||
              st == KVQ_E_NOMEM || (st >= KVQ_E_BAD_MAGIC && st <= KVQ_E_CORRUPT));
    }
    remove_file(dir, "config.json");
    remove_file(dir, "model.safetensors.index.json");
    CHECK(rmdir(dir) == 0);
    return 0;
}
