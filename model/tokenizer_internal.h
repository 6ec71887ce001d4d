/*
 * tokenizer_internal.h — what the tokenizer files share: tokenizer.c (the core: tables,
 * queries, encode/decode), tokenizer_merge.c (the merge engine), tokenizer_sp.c (SPM
 * encoding), tokenizer_bpe.c (BPE encoding, pre-tokenizer) and the loaders
 * tokenizer_gguf.c, tokenizer_hf.c and tokenizer_llama2c.c. Not installed.
 */
#ifndef KVQ_TOKENIZER_INTERNAL_H
#define KVQ_TOKENIZER_INTERNAL_H

#include "kvq/tokenizer.h"

/* One slot of the (left id, right id) -> merge table. */
typedef struct tok_pair {
    uint64_t key;   /* (uint64)left << 32 | right; UINT64_MAX = empty */
    int32_t rank;   /* index in the merge list: lower merges first */
    int32_t id;     /* the merged token */
} tok_pair;

struct kvq_tokenizer {
    kvq_tokenizer_kind kind;
    char model[32];                 /* "llama", "gpt2", "hf-bpe", "llama2c", "ids" */
    uint32_t n;                     /* vocabulary size */

    char *str;                      /* token strings, each NUL-terminated */
    uint64_t *str_off;              /* [n] offsets into str */
    uint32_t *str_len;              /* [n] */
    char *piece;                    /* decoded pieces, each NUL-terminated */
    uint64_t *piece_off;            /* [n] */
    uint32_t *piece_len;            /* [n] */
    float *scores;                  /* [n] or NULL */
    uint8_t *types;                 /* [n] kvq_token_type */

    int32_t *table;                 /* [table_mask + 1] string -> id, -1 = empty */
    size_t table_mask;

    int32_t byte_tok[256];          /* <0xHH> token per byte, -1 = none */
    int32_t byte_sym[256];          /* byte-level: token of the mapped char, -1 = none */

    tok_pair *pairs;                /* [pair_mask + 1], NULL without merges */
    size_t pair_mask;

    int32_t bos, eos, unk;
    int add_bos, add_eos;
    int add_space_prefix;           /* SPM / metaspace dummy prefix */
    int byte_level, ignore_merges, drop_unknown;
    kvq_pretok pretok;
    uint32_t max_digits;
    kvq_normalizer normalizer;      /* HF NFC / NFKC, applied before the split */
    char approx[192];               /* what was approximated ("" = exact) */
};

/* ---- shared helpers (tokenizer.c) ---------------------------------------------------- */

/* Id of the token whose string is s[0..len), or -1. */
int32_t tok_lookup(const kvq_tokenizer *t, const char *s, size_t len);

/* Rank and result of merging tokens l and r: 1 if the pair merges, else 0. */
int tok_pair_lookup(const kvq_tokenizer *t, int32_t l, int32_t r, int32_t *rank, int32_t *id);

/* "<0xHH>" (upper- or lower-case hex) -> HH, else -1. */
int tok_parse_byte_token(const char *s, size_t n);

/* Length of the well-formed UTF-8 code point at s[0..n) (1-4), or 0 when s[0] does not
 * start one (the caller then treats the single byte as a symbol). *cp gets the value. */
size_t tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);

/* Growable id vector. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
int tok_ids_push(tok_ids *a, int32_t id); /* 0 ok, -1 out of memory */

/* ---- the merge engine (tokenizer_merge.c) -------------------------------------------
 * Symbols are contiguous spans of the working buffer in a doubly linked list. The
 * pair callback says whether l and r may merge: it returns 1 and sets *prio (higher
 * merges first) and *id (the merged token), or 0. tok_merge runs merges until none is
 * left, always taking the highest priority and, among equals, the leftmost pair.
 * Cost O(n log n). */
typedef struct tok_sym {
    uint32_t start, len;  /* span in the working buffer */
    int32_t id;           /* token id, -1 = not a token (byte fallback later) */
    int32_t prev, next;   /* neighbours, -1 at the ends; len == 0 marks a dead symbol */
} tok_sym;

typedef int (*tok_pair_fn)(const void *ctx, const tok_sym *l, const tok_sym *r, double *prio,
                           int32_t *id);

/* 0 ok, -1 out of memory. syms[0..n) must be linked in order. */
int tok_merge(tok_sym *syms, size_t n, tok_pair_fn fn, const void *ctx);

/* Appends the final ids of a merged symbol list (starting at syms[0]), using byte
 * fallback (<0xHH>, else unk) for symbols whose id is -1. buf is the working buffer.
 * Returns KVQ_OK, KVQ_E_INVALID_ARG (no fallback) or KVQ_E_NOMEM. */
kvq_status tok_emit(const kvq_tokenizer *t, const tok_sym *syms, size_t n, const char *buf,
                    tok_ids *out, kvq_err *err);

/* ---- SPM / metaspace preprocessing (tokenizer_sp.c) ----------------------------------- */
/* *buf (malloc'd) = optional '▁' prefix + text with every ' ' replaced by '▁'. */
kvq_status tok_metaspace_buffer(const char *text, size_t len, int prefix, char **buf,
                                size_t *n, kvq_err *err);
/* One linked symbol per code point of buf (a stray byte is its own symbol); each
 * symbol's id is its token or -1. *syms malloc'd. */
kvq_status tok_split_code_points(const kvq_tokenizer *t, const char *buf, size_t n,
                                 tok_sym **syms, size_t *count, kvq_err *err);

/* ---- encoders ---------------------------------------------------------------------- */
/* Append the ids of text[0..len) to out (no BOS/EOS). prefix: add the dummy prefix space
 * (kvq_tokenizer_encode decides with kvq_tokenizer_adds_prefix). */
kvq_status tok_spm_encode(const kvq_tokenizer *t, const char *text, size_t len, int prefix,
                          tok_ids *out, kvq_err *err);
kvq_status tok_bpe_encode(const kvq_tokenizer *t, const char *text, size_t len, int prefix,
                          tok_ids *out, kvq_err *err);

/* ---- byte-level alphabet (tokenizer_bpe.c) ------------------------------------------ */
/* GPT-2's byte -> code point map, and its inverse (-1 for other code points). */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);

/* ---- pre-token splits (tokenizer_pretok.c) ------------------------------------------ */
/* The split whose HF Split regex is re (tokenizer.json's spelling): 1 and *style,
 * *digits set, or 0 when re is not one kvq knows. */
int tok_pretok_from_regex(const char *re, kvq_pretok *style, uint32_t *digits);
/* Is re stage k (0..4) of deepseek-llm's HF Split sequence? */
int tok_pretok_deepseek_stage(int k, const char *re);

/* ---- Unicode normalization (tokenizer_norm.c) ----------------------------------------- */
/* *out (malloc'd, *out_len bytes, NUL-terminated) = NFC or NFKC of s[0..n). Bytes that
 * are not well-formed UTF-8 pass through unchanged and block composition. */
kvq_status tok_normalize(kvq_normalizer form, const char *s, size_t n, char **out,
                         size_t *out_len, kvq_err *err);

/* Class of a code point in the byte-level pre-tokenizer (tokenizer_pretok.c): 0 other,
 * 1 letter (\p{L}), 2 number (\p{N}), 3 space (\s); above U+10FFFF: other. */
int tok_cp_class(uint32_t cp);

#endif
