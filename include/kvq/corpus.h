/*
 * kvq/corpus.h — the calibration corpus: text sources and synthetic tasks, read as a
 * stream of documents and cut into token sequences for `kvq capture`.
 *
 * A corpus spec is a comma-separated list of sources (a path cannot contain a comma):
 *
 *   file:PATH       one text file. Files larger than max_doc_bytes are read in parts
 *                   (cut after the last '\n' of each part, else at a UTF-8 boundary);
 *                   parts after the first have doc->part > 0 and continue the text.
 *   dir:PATH        every *.txt and *.md file under PATH, depth-first, the entries of
 *                   each directory in strcmp order; names starting with '.' are
 *                   skipped; symbolic links to files are followed, to directories not.
 *   jsonl:PATH      one JSON object per line with a string field "text"; blank lines
 *                   are skipped; any other line that is not such an object fails with
 *                   KVQ_E_BAD_JSON naming "PATH:LINE". An optional "answer" string
 *                   (1 .. 31 bytes) makes the line a task document (kvq eval answers
 *                   it), of kind "task": "passkey" (the default) or "kv-recall".
 *   ids:PATH        pre-tokenized: little-endian int32 token ids (read in parts too).
 *   uuid:N          N documents of uuid_lines random UUID v4 strings, one per line
 *                   (the a2ats calibration set mixes text with such lines).
 *   passkey:N       N passkey-retrieval prompts: an instruction, passkey_filler filler
 *                   lines with "The pass key is NNNNN. Remember it. NNNNN is the pass
 *                   key." at a random position, then "What is the pass key? The pass
 *                   key is". The answer is the 5-digit number.
 *   kv-recall:N     N key-value recall prompts: kv_pairs lines "KEY: VALUE" (8 hex
 *                   digits each, keys distinct), then "What is the value of key KEY?
 *                   The value of key KEY is". The answer is VALUE.
 *   PATH            auto-detected: a directory -> dir, "*.jsonl" -> jsonl, else file.
 *
 * An item whose text before the first ':' is not one of the kind names is a plain
 * path. N is 1 .. 10^7. Generated documents depend only on (seed, kind, the ordinal of
 * the source among sources of that kind, document number): adding another source
 * does not change them, and the same seed gives the same bytes on every platform.
 * Empty documents (empty files, "text": "") are skipped.
 *
 * Reading streams: one document is in memory at a time (a file part is at most
 * max_doc_bytes; a jsonl line is one document whatever its size), and a directory is
 * listed one level at a time.
 */
#ifndef KVQ_CORPUS_H
#define KVQ_CORPUS_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/corpus.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include "kvq/common.h"
#include "kvq/perplexity.h"
#include "kvq/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvq_corpus_kind {
    KVQ_CORPUS_FILE = 1,
    KVQ_CORPUS_DIR = 2,
    KVQ_CORPUS_JSONL = 3,
    KVQ_CORPUS_IDS = 4,
    KVQ_CORPUS_UUID = 5,
    KVQ_CORPUS_PASSKEY = 6,
    KVQ_CORPUS_KV_RECALL = 7
} kvq_corpus_kind;

/* "file", "dir", "jsonl", "ids", "uuid", "passkey", "kv-recall"; "?" otherwise. */
const char *kvq_corpus_kind_name(kvq_corpus_kind k);

typedef enum kvq_corpus_task {
    KVQ_TASK_NONE = 0,
    KVQ_TASK_PASSKEY = 1,
    KVQ_TASK_KV_RECALL = 2
} kvq_corpus_task;

typedef struct kvq_corpus_params {
    uint64_t seed;            /* synthetic generators (default 0) */
    uint32_t uuid_lines;      /* UUIDs per uuid document, 1 .. 10^6 (default 64) */
    uint32_t passkey_filler;  /* filler lines per passkey document, 0 .. 10^6 (default 40) */
    uint32_t kv_pairs;        /* pairs per kv-recall document, 1 .. 65536 (default 32) */
    size_t max_doc_bytes;     /* largest document read at once, 4096 .. 2^31 (default 64 KiB:
                                 encoding speed falls with document size, ~1.5 MB/s at
                                 64 KiB vs ~0.6 MB/s at 1 MiB for SPM) */
} kvq_corpus_params;

void kvq_corpus_params_default(kvq_corpus_params *p);

typedef struct kvq_corpus kvq_corpus;

/* One parsed source. */
typedef struct kvq_corpus_source {
    kvq_corpus_kind kind;
    const char *path;   /* file/dir/jsonl/ids; NULL for generators */
    uint64_t count;     /* generators: documents; 0 for paths */
} kvq_corpus_source;

/* Parses spec and checks that every path exists with the right type (a directory for
 * dir:, a regular file otherwise). p may be NULL (defaults). Nothing is read yet.
 * Errors: KVQ_E_INVALID_ARG (empty spec or item, bad N, bad parameter; the message
 * quotes the item), KVQ_E_NOT_FOUND (a path that does not exist), KVQ_E_NOMEM. */
kvq_status kvq_corpus_open(const char *spec, const kvq_corpus_params *p, kvq_corpus **out,
                           kvq_err *err);
void kvq_corpus_free(kvq_corpus *c); /* NULL is fine */

const char *kvq_corpus_spec(const kvq_corpus *c);
size_t kvq_corpus_source_count(const kvq_corpus *c);
const kvq_corpus_source *kvq_corpus_source_at(const kvq_corpus *c, size_t i);
/* For a model without a tokenizer (model_path names it): KVQ_E_UNSUPPORTED "MODEL: has no
 * tokenizer (no vocabulary in its metadata), so corpus item N (KIND) cannot be read:
 * give token ids (ids:FILE)" when a source of c is text, else KVQ_OK. */
kvq_status kvq_corpus_check_no_tokenizer(const kvq_corpus *c, const char *model_path,
                                         kvq_err *err); /* NULL if out */

/* ---- documents --------------------------------------------------------------------- */

typedef struct kvq_corpus_doc {
    uint64_t index;          /* 0-based, over the whole corpus (each part counts) */
    uint32_t source;         /* index of its source in the spec */
    uint32_t part;           /* 0: a new document; k > 0: the k-th continuation of a file */
    const char *label;       /* "PATH", "PATH:LINE" (jsonl), "passkey#3" (generators) */
    const char *text;        /* [len] bytes, NUL-terminated; NULL for ids documents */
    size_t len;
    const int32_t *ids;      /* [n_ids] for ids documents, else NULL */
    size_t n_ids;
    kvq_corpus_task task;    /* synthetic tasks: what the prompt asks */
    const char *answer;      /* the expected continuation without its leading space
                                ("48213"), NULL when task is NONE */
} kvq_corpus_doc;

typedef struct kvq_corpus_iter kvq_corpus_iter;

/* Iteration: kvq_corpus_iter_next sets *doc to the next document, or to NULL at the
 * end (returning KVQ_OK). *doc and everything it points to stay valid until the next
 * call or kvq_corpus_iter_free. Errors: KVQ_E_NOT_FOUND / KVQ_E_IO (a file went away
 * or could not be read), KVQ_E_BAD_JSON (jsonl, "PATH:LINE: ..."), KVQ_E_CORRUPT (an
 * ids file whose size is not a multiple of 4 or with a negative id), KVQ_E_NOMEM.
 * After an error the iterator can only be freed. */
kvq_status kvq_corpus_iter_new(const kvq_corpus *c, kvq_corpus_iter **out, kvq_err *err);
kvq_status kvq_corpus_iter_next(kvq_corpus_iter *it, const kvq_corpus_doc **doc, kvq_err *err);
void kvq_corpus_iter_free(kvq_corpus_iter *it);

/* Provenance: kvq_fnv1a64 (seed KVQ_FNV1A64_INIT) over the bytes of every document in
 * order — text bytes, or for ids documents each id as 4 little-endian bytes — so a
 * file read in parts hashes like the whole file. Reads the whole corpus once. Any
 * output pointer may be NULL. Errors: those of kvq_corpus_iter_next. */
kvq_status kvq_corpus_hash(const kvq_corpus *c, uint64_t *hash, uint64_t *n_docs,
                           uint64_t *n_bytes, kvq_err *err);

/* ---- token sequences ---------------------------------------------------------------- */

typedef enum kvq_doc_sep {
    KVQ_DOC_SEP_BOS = 0,   /* BOS between packed documents (how llama2.c trains) */
    KVQ_DOC_SEP_EOS = 1,
    KVQ_DOC_SEP_NONE = 2
} kvq_doc_sep;

typedef struct kvq_seq_params {
    uint32_t seq_len;      /* tokens per sequence, leading BOS included; >= 2 (default 512) */
    uint64_t max_tokens;   /* stop once this many tokens were emitted; 0 = no limit (default) */
    int add_bos;           /* every sequence starts with BOS (default 1) */
    int per_document;      /* 0 (default): pack documents into one stream;
                              1: each new document (part 0) starts a new sequence */
    kvq_doc_sep sep;       /* packing: token put between documents (default BOS); a
                              separator never starts a sequence */
    int keep_partial;      /* emit sequences shorter than seq_len (at least 2 tokens) at the
                              end of the corpus, of a document (per_document) or of the
                              max_tokens budget (default 1); 0 drops them */
} kvq_seq_params;

void kvq_seq_params_default(kvq_seq_params *p);
/* BOS as the model says: add_bos when t adds BOS (kvq_tokenizer_add_bos) and has one,
 * documents separated by BOS then, else by EOS when t has one, else by nothing. The
 * other fields are left as they are. */
void kvq_seq_params_model_bos(kvq_seq_params *p, const kvq_tokenizer *t);

typedef struct kvq_corpus_seq {
    const int32_t *ids;    /* [n] */
    uint32_t n;            /* seq_len, or fewer for a partial sequence */
    uint64_t index;        /* 0-based sequence number */
    uint64_t token_offset; /* tokens emitted before this sequence */
    uint64_t first_doc;    /* index of the document of its first document token */
    uint64_t last_doc;     /* ... and of its last */
} kvq_corpus_seq;

/* Called once per sequence; seq is valid during the call only. Return KVQ_OK to go on;
 * any other status stops kvq_corpus_tokenize, which returns it (fill err yourself). */
typedef kvq_status (*kvq_seq_fn)(void *user, const kvq_corpus_seq *seq, kvq_err *err);

typedef struct kvq_corpus_stats {
    uint64_t n_docs;        /* documents read (continuation parts included) */
    uint64_t n_bytes;       /* their bytes (ids: 4 per id) */
    uint64_t hash;          /* kvq_fnv1a64 over those bytes, as kvq_corpus_hash; equal to it
                               when the whole corpus was read */
    uint64_t n_doc_tokens;  /* tokens the documents gave (no BOS/separators) */
    uint64_t n_tokens;      /* tokens emitted, BOS and separators included */
    uint64_t n_seqs;        /* sequences emitted */
    uint64_t n_dropped;     /* document tokens read but not emitted (short tail, budget) */
} kvq_corpus_stats;

/* Reads the corpus in order, tokenizes each document (text documents with
 * kvq_tokenizer_encode, the dummy prefix only on part 0; ids documents as they are),
 * and cuts the token stream into sequences of p->seq_len tokens that each start with
 * BOS (when add_bos), calling fn for each, until the corpus ends or max_tokens tokens
 * were emitted (then no further document is read). Documents are packed (separated by
 * p->sep) unless per_document. Progress goes to cb as ("tokenize", tokens emitted,
 * max_tokens); a non-zero progress return stops with KVQ_E_CANCELLED. stats (may be
 * NULL) is filled on success and on error. Memory: one document, its tokens and the
 * tokenizer's scratch (up to ~100 x max_doc_bytes for SPM; see kvq_tokenizer_encode).
 * Errors: KVQ_E_INVALID_ARG (seq_len < 2; BOS or a separator token that the tokenizer
 * lacks; "corpus 'SPEC' contains no text" when no document gave a token; no sequence
 * could be formed), KVQ_E_MISMATCH (an ids document with an id outside the
 * vocabulary: message names the label and position), the iterator's and the
 * tokenizer's errors, fn's status, KVQ_E_CANCELLED. */
kvq_status kvq_corpus_tokenize(const kvq_corpus *c, const kvq_tokenizer *t,
                               const kvq_seq_params *p, const kvq_callbacks *cb, kvq_seq_fn fn,
                               void *user, kvq_corpus_stats *stats, kvq_err *err);

/* ---- a corpus held in memory ------------------------------------------------------ */

/* A kvq_seq_fn: appends seq to the kvq_seq_set (kvq/perplexity.h) `user`. Errors: NOMEM. */
kvq_status kvq_seq_set_add(void *user, const kvq_corpus_seq *seq, kvq_err *err);

/* Cuts corpus c into sequences with tokenizer t and params p (kvq_corpus_tokenize,
 * progress through cb, stats may be NULL) and appends them to *out. Errors: those of
 * kvq_corpus_tokenize, NOMEM. */
kvq_status kvq_seq_set_collect(const kvq_corpus *c, const kvq_tokenizer *t,
                               const kvq_seq_params *p, const kvq_callbacks *cb,
                               kvq_seq_set *out, kvq_corpus_stats *stats, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CORPUS_H */
