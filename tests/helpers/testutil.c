/* testutil.c — see testutil.h. */
#include "helpers/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvq/util.h"

static int exists(const char *p) { return p && access(p, R_OK) == 0; }

const char *test_model_path(void)
{
    const char *p = getenv("KVQ_TEST_MODEL");
    if (!p || !*p)
        p = "../shared/models/stories260K.gguf";
    return exists(p) ? p : NULL;
}

const char *test_smollm2_path(void)
{
    const char *p = getenv("KVQ_SMOLLM2");
    if (!p || !*p)
        p = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    return exists(p) ? p : NULL;
}

const char *test_real_model(int *is_stories)
{
    const char *p = test_model_path();
    *is_stories = p != NULL;
    return p ? p : test_smollm2_path();
}

static const char *sibling(const char *name)
{
    static char buf[2][4096];
    static int k;
    const char *m = getenv("KVQ_TEST_MODEL");
    if (!m || !*m)
        m = "../shared/models/stories260K.gguf";
    char *b = buf[k++ & 1];
    const char *slash = strrchr(m, '/');
    size_t dir = slash ? (size_t)(slash - m + 1) : 0;
    snprintf(b, sizeof buf[0], "%.*s%s", (int)dir, m, name);
    return exists(b) ? b : NULL;
}

const char *test_model_bin_path(void) { return sibling("stories260K.bin"); }
const char *test_tokenizer_bin_path(void) { return sibling("tok512.bin"); }

static char tmp_root[256];

const char *test_tmpdir(void)
{
    if (!tmp_root[0]) {
        snprintf(tmp_root, sizeof tmp_root, "/tmp/kvq-test-XXXXXX");
        if (!mkdtemp(tmp_root)) {
            perror("mkdtemp");
            abort();
        }
    }
    return tmp_root;
}

void test_tmpdir_cleanup(void)
{
    if (tmp_root[0])
        kvq_rmtree(tmp_root);
    tmp_root[0] = 0;
}

const char *test_path(const char *name)
{
    static char buf[8][4096];
    static int k;
    char *b = buf[k++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", test_tmpdir(), name);
    return b;
}

int test_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

kvq_model_id test_synthetic_id(int32_t n_layers, int32_t n_heads, int32_t n_kv, int32_t d)
{
    kvq_model_id id;
    memset(&id, 0, sizeof id);
    snprintf(id.path, sizeof id.path, "synthetic");
    snprintf(id.source, sizeof id.source, "gguf");
    snprintf(id.architecture, sizeof id.architecture, "llama");
    id.n_layers = n_layers;
    id.dim = n_heads * d;
    id.hidden_dim = 4 * n_heads * d;
    id.n_heads = n_heads;
    id.n_kv_heads = n_kv;
    id.head_dim = d;
    id.vocab_size = 512;
    id.context_length = 2048;
    id.norm_eps = 1e-5;
    id.rope = kvq_rope_default(d);
    return id;
}

kvq_model_config test_synthetic_config(int32_t n_layers, int32_t n_heads, int32_t n_kv, int32_t d)
{
    kvq_model_id id = test_synthetic_id(n_layers, n_heads, n_kv, d);
    return kvq_model_config_from_id(&id);
}

void test_random_qkv(uint64_t seed, float *q, size_t nq, float *k, float *v, size_t nkv)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)kvq_rng_normal(&r);
    for (size_t i = 0; i < nkv; i++) {
        k[i] = (float)kvq_rng_normal(&r);
        v[i] = (float)kvq_rng_normal(&r);
    }
}
