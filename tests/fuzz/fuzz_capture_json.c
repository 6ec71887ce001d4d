/* fuzz_capture_json.c — libFuzzer target for the capture.json reader.
 *
 * Parses the input with kvq_capture_info_read_memory as the capture.json of the
 * directory "cap". A failure must carry a documented status, a message starting with
 * "cap/capture.json: " and no result. A success must satisfy the contract of
 * kvq_capture_info (ranges, unique layers, plain file names, sequences inside
 * [0, n_tokens)), answer find_layer and file_path consistently, parse the same a second
 * time, and its model identity must survive kvq_model_id_set_meta -> safetensors ->
 * kvq_model_id_from_meta unchanged. Any inconsistency aborts.
 * Also built as a plain corpus replayer (tests/fuzz/replay_main.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/capture_dir.h"
#include "kvq/safetensors.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static const char LABEL[] = "cap/capture.json: ";

static int is_plain_name(const char *s)
{
    return s[0] && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") && strcmp(s, "..");
}

/* The model identity through __metadata__ keys and back. */
static void check_identity_round_trip(const kvq_model_id *m)
{
    kvq_st_writer *w = kvq_st_writer_new();
    CHECK(w);
    CHECK(kvq_model_id_set_meta(m, "model.", w, NULL) == KVQ_OK);
    CHECK(kvq_st_writer_begin_buffer(w, NULL) == KVQ_OK);
    CHECK(kvq_st_writer_finish(w, NULL) == KVQ_OK);
    size_t size = 0;
    const void *buf = kvq_st_writer_buffer(w, &size);
    kvq_st *st = NULL;
    CHECK(kvq_st_open_memory(buf, size, "meta", &st, NULL) == KVQ_OK);
    kvq_model_id back;
    memset(&back, 0, sizeof back);
    kvq_err err = {0};
    CHECK(kvq_model_id_from_meta(st, "model.", "meta", &back, &err) == KVQ_OK);
    CHECK(kvq_model_id_compare(m, "a", &back, "b", &err) == KVQ_OK);
    CHECK(strcmp(m->path, back.path) == 0 && strcmp(m->source, back.source) == 0);
    kvq_st_close(st);
    kvq_st_writer_free(w);
}

static void check_info(const kvq_capture_info *ci)
{
    const kvq_model_id *m = &ci->model;
    CHECK(strcmp(ci->dir, "cap") == 0 &&
          (ci->version == 1 || ci->version == KVQ_CAPTURE_VERSION));
    CHECK(memchr(ci->tool, 0, sizeof ci->tool) && memchr(ci->corpus_spec, 0, sizeof ci->corpus_spec));
    CHECK(memchr(ci->corpus_hash, 0, sizeof ci->corpus_hash));
    CHECK(memchr(m->path, 0, sizeof m->path) && memchr(m->source, 0, sizeof m->source));
    CHECK(memchr(m->architecture, 0, sizeof m->architecture));
    CHECK(m->n_layers >= 1 && m->dim >= 1 && m->hidden_dim >= 1 && m->vocab_size >= 1);
    CHECK(m->n_heads >= 1 && m->n_kv_heads >= 1 && m->n_heads % m->n_kv_heads == 0);
    CHECK(m->head_dim >= 2 && m->head_dim % 2 == 0 && m->rope.head_dim == m->head_dim);
    CHECK(m->context_length >= 1);
    kvq_err err = {0};
    CHECK(kvq_rope_check(&m->rope, &err) == KVQ_OK);
    CHECK(ci->dtype == KVQ_DT_F32 || ci->dtype == KVQ_DT_F16 || ci->dtype == KVQ_DT_BF16);
    CHECK(ci->n_tokens >= 1 && ci->n_tokens <= INT32_MAX && ci->seq_len >= 0);
    CHECK(ci->n_documents >= 0 && ci->n_queries >= 0);
    CHECK(ci->has_values == 0 || ci->has_values == 1);
    CHECK(ci->n_sequences >= 0 && ci->n_sequences <= ci->n_tokens);
    CHECK(ci->n_sequences == 0 || ci->sequences != NULL);
    for (int64_t i = 0; i < ci->n_sequences; i++) {
        const int64_t first = ci->sequences[2 * i], len = ci->sequences[2 * i + 1];
        CHECK(first >= 0 && len >= 0 && first + len <= ci->n_tokens);
    }
    CHECK(ci->n_files >= 1 && ci->n_files <= m->n_layers && ci->layers && ci->files);
    for (int32_t i = 0; i < ci->n_files; i++) {
        CHECK(ci->layers[i] >= 0 && ci->layers[i] < m->n_layers);
        CHECK(kvq_capture_info_find_layer(ci, ci->layers[i]) == i); /* unique */
        CHECK(ci->files[i] && is_plain_name(ci->files[i]));
        char *path = NULL;
        CHECK(kvq_capture_info_file_path(ci, i, &path, &err) == KVQ_OK);
        CHECK(strncmp(path, "cap/", 4) == 0 && strcmp(path + 4, ci->files[i]) == 0);
        free(path);
    }
    CHECK(kvq_capture_info_find_layer(ci, -1) == -1);
    CHECK(kvq_capture_info_find_layer(ci, m->n_layers) == -1);
    CHECK(kvq_model_id_compare(m, "a", m, "b", &err) == KVQ_OK);
}

/* Two parses of the same bytes give the same result. */
static void check_same(const kvq_capture_info *a, const kvq_capture_info *b)
{
    kvq_err err = {0};
    CHECK(kvq_model_id_compare(&a->model, "a", &b->model, "b", &err) == KVQ_OK);
    CHECK(strcmp(a->tool, b->tool) == 0 && strcmp(a->corpus_spec, b->corpus_spec) == 0);
    CHECK(strcmp(a->corpus_hash, b->corpus_hash) == 0 && a->corpus_seed == b->corpus_seed);
    CHECK(a->n_documents == b->n_documents && a->dtype == b->dtype);
    CHECK(a->seq_len == b->seq_len && a->n_tokens == b->n_tokens);
    CHECK(a->n_queries == b->n_queries && a->has_values == b->has_values);
    CHECK(a->n_sequences == b->n_sequences && a->n_files == b->n_files);
    CHECK(a->n_sequences == 0 ||
          memcmp(a->sequences, b->sequences, 2 * (size_t)a->n_sequences * sizeof *a->sequences) == 0);
    for (int32_t i = 0; i < a->n_files; i++)
        CHECK(a->layers[i] == b->layers[i] && strcmp(a->files[i], b->files[i]) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvq_capture_info *ci = (kvq_capture_info *)data; /* must be overwritten */
    kvq_err err = {0};
    const kvq_status st = kvq_capture_info_read_memory("cap", data, size, &ci, &err);
    if (st != KVQ_OK) {
        CHECK(ci == NULL && err.status == st);
        CHECK(strncmp(err.msg, LABEL, sizeof LABEL - 1) == 0);
        CHECK(st == KVQ_E_BAD_JSON || st == KVQ_E_BAD_MAGIC || st == KVQ_E_VERSION ||
              st == KVQ_E_UNSUPPORTED || st == KVQ_E_CORRUPT || st == KVQ_E_TOO_LARGE ||
              st == KVQ_E_NOMEM);
        return 0;
    }
    CHECK(ci != NULL);
    check_info(ci);
    check_identity_round_trip(&ci->model);
    kvq_capture_info *again = NULL;
    CHECK(kvq_capture_info_read_memory("cap", data, size, &again, &err) == KVQ_OK);
    check_same(ci, again);
    kvq_capture_info_free(again);
    kvq_capture_info_free(ci);
    return 0;
}
