/*
 * kvq/tokenizer.h — text to token ids for calibration (and ids back to text).
 *
 * Three kinds:
 *
 *   KVQ_TOKENIZER_SPM   SentencePiece-style vocabulary with scores and byte fallback,
 *                       as in GGUF tokenizer.ggml.model = "llama" and llama2.c's
 *                       tokenizer.bin. Encoding, as llama.cpp and llama2.c do it:
 *                       prepend one space (the "dummy prefix", when add_space_prefix),
 *                       replace every ' ' by U+2581 '▁', split into UTF-8 code points
 *                       (a byte that does not start a well-formed code point is a
 *                       symbol of its own), then repeatedly merge the adjacent pair
 *                       whose concatenation is in the vocabulary with the highest
 *                       score (ties: the leftmost pair). A final symbol that is not
 *                       a token becomes its bytes' <0xHH> tokens, or the unknown token
 *                       when the vocabulary has no byte tokens.
 *
 *   KVQ_TOKENIZER_BPE   BPE with ranked merges: GGUF tokenizer.ggml.model = "gpt2"
 *                       (tokens + tokenizer.ggml.merges) and HF tokenizer.json with
 *                       model.type = "BPE". Two flavours:
 *                       - byte-level (GPT-2, Llama-3, Qwen2): the text is split into
 *                         pre-tokens (below), each pre-token's bytes are mapped to
 *                         GPT-2's printable byte-to-unicode alphabet, and within each
 *                         pre-token the adjacent pair with the lowest merge rank is
 *                         merged until none is left (ties: leftmost). With
 *                         ignore_merges (Llama-3) a pre-token that is itself a token
 *                         is emitted whole.
 *                       - metaspace (HF Llama-2/Mistral-style tokenizer.json: BPE with
 *                         byte_fallback and a '▁' normalizer or Metaspace pre-tokenizer):
 *                         like SPM preprocessing, then rank-based merges over the whole
 *                         text, <0xHH> fallback. Metaspace's split at each '▁' is not
 *                         applied (it only matters for merges that cross a '▁').
 *
 *   KVQ_TOKENIZER_IDS   no vocabulary: a placeholder for pre-tokenized input (files of
 *                       little-endian int32 ids, see kvq_ids_read and the corpus
 *                       "ids:" source). Encoding text fails with KVQ_E_UNSUPPORTED;
 *                       a token decodes to "<ID>".
 *
 * Pre-tokenizer split (byte-level BPE). kvq implements these regular expressions by
 * hand; alternatives are tried in order at each position, first match wins:
 *
 *   KVQ_PRETOK_GPT2:
 *     's|'t|'re|'ve|'m|'ll|'d | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
 *   KVQ_PRETOK_LLAMA3 (max_digits = 3 for Llama-3, 1 for Qwen2, 0 = unlimited):
 *     (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,max_digits}
 *     | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 *
 * The character classes are an approximation of Unicode's: \s is exact (White_Space);
 * \p{N} is exact for ASCII and Latin-1 and covers the decimal digits of the common
 * scripts, fullwidth digits, super/subscripts, number forms and circled numbers;
 * \p{L} is exact for ASCII and Latin-1, and above U+00FF every code point that is not
 * \s, not \p{N} and not in a table of punctuation/symbol/mark blocks (combining
 * diacritics U+0300-036F, general punctuation, currency, arrows, math, box drawing,
 * dingbats, CJK punctuation, fullwidth punctuation, emoji, private use, ...) counts as
 * a letter. So text in Latin, Greek, Cyrillic, CJK and similar scripts splits as the
 * real regex does; combining marks of Indic scripts count as letters here (the real
 * regex isolates them). Bytes that are not well-formed UTF-8 count as punctuation.
 * Unicode normalizers (NFC/NFKC) are not applied, and special (added) tokens are never
 * matched inside text: calibration text is data, not a chat template.
 *
 * A tokenizer is immutable once built: every function below may be called from
 * several threads at once. Memory: the token strings twice (as stored and decoded),
 * a hash table of 2-4 slots per token, and for BPE a table of 2-4 slots per merge.
 */
#ifndef KVQ_TOKENIZER_H
#define KVQ_TOKENIZER_H

#include "kvq/common.h"
#include "kvq/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvq_tokenizer kvq_tokenizer;

typedef enum kvq_tokenizer_kind {
    KVQ_TOKENIZER_SPM = 1,
    KVQ_TOKENIZER_BPE = 2,
    KVQ_TOKENIZER_IDS = 3
} kvq_tokenizer_kind;

/* Token types: the values of GGUF tokenizer.ggml.token_type. */
typedef enum kvq_token_type {
    KVQ_TOKEN_NORMAL = 1,
    KVQ_TOKEN_UNKNOWN = 2,
    KVQ_TOKEN_CONTROL = 3,      /* BOS, EOS, special tokens: decode to "" */
    KVQ_TOKEN_USER_DEFINED = 4, /* decoded as stored (no byte-level mapping) */
    KVQ_TOKEN_UNUSED = 5,
    KVQ_TOKEN_BYTE = 6          /* "<0xHH>": decodes to the byte HH */
} kvq_token_type;

typedef enum kvq_pretok {
    KVQ_PRETOK_NONE = 0,   /* no split: the whole text is one pre-token */
    KVQ_PRETOK_GPT2 = 1,
    KVQ_PRETOK_LLAMA3 = 2
} kvq_pretok;

/* Largest vocabulary accepted (ids are int32; real vocabularies are < 2^20). */
#define KVQ_TOKENIZER_MAX_VOCAB (1u << 24)

/* ---- building from arrays ------------------------------------------------------
 * Every loader fills a kvq_vocab and calls kvq_tokenizer_new; tests and converters
 * can do the same. All arrays are read during the call and copied. */
typedef struct kvq_vocab {
    uint32_t n_tokens;          /* 1 .. KVQ_TOKENIZER_MAX_VOCAB */
    const char *const *tokens;  /* [n_tokens] token strings as the model stores them
                                   (SPM: '▁' for space; byte-level BPE: GPT-2 alphabet) */
    const uint32_t *token_lens; /* [n_tokens] byte lengths, or NULL to use strlen */
    const float *scores;        /* [n_tokens] merge scores; required for SPM */
    const int32_t *types;       /* [n_tokens] kvq_token_type (0 = normal), or NULL to infer:
                                   "<0xHH>" is BYTE, the bos/eos ids CONTROL, unk UNKNOWN */
    uint32_t n_merges;          /* BPE: merges in rank order (rank = index) */
    const char *const *merges;  /* [n_merges] "left right" (split at the first space), or */
    const char *const *merge_pairs; /* [2 * n_merges] left, right (used when merges is NULL) */
    int32_t bos, eos, unk;      /* token ids, -1 = none */
    int add_bos;                /* the model expects BOS at the start of a sequence */
    int add_space_prefix;       /* dummy prefix ' ' before the text: always for SPM and
                                   metaspace; byte-level BPE (HF ByteLevel add_prefix_space)
                                   only when the text does not start with ' ' */
    int byte_level;             /* BPE: 1 byte-level, 0 metaspace ('▁' + byte fallback) */
    int ignore_merges;          /* BPE byte-level: a pre-token that is a token is kept */
    kvq_pretok pretok;          /* BPE byte-level split */
    uint32_t max_digits;        /* KVQ_PRETOK_LLAMA3: digits per number chunk (0 = all) */
    const char *model;          /* name for messages and kvq_tokenizer_model ("llama") */
} kvq_vocab;

/* Sets every field to its default: all NULL/0, bos = eos = unk = -1,
 * add_space_prefix = 1, byte_level = 1, pretok = KVQ_PRETOK_GPT2. */
void kvq_vocab_default(kvq_vocab *v);

/* Builds a tokenizer of `kind` (SPM or BPE) from v. label names the source in
 * messages. Duplicate token strings: the first id wins for encoding.
 * Errors (message names label and the tokenizer model): KVQ_E_INVALID_ARG (NULL
 * arrays, kind IDS), KVQ_E_TOO_LARGE (vocabulary size), KVQ_E_CORRUPT (bos/eos/unk out
 * of range, a type out of range, a BYTE token not of the form <0xHH>, SPM without
 * scores, a merge without a space), KVQ_E_NOMEM. A merge whose parts or result are not
 * tokens is skipped and counted in a KVQ_LOG_WARN message through cb (may be NULL). */
kvq_status kvq_tokenizer_new(kvq_tokenizer_kind kind, const kvq_vocab *v, const char *label,
                             const kvq_callbacks *cb, kvq_tokenizer **out, kvq_err *err);

/* A vocabulary-less tokenizer for pre-tokenized input: n_vocab ids, bos/eos (or -1). */
kvq_status kvq_tokenizer_new_ids(uint32_t n_vocab, int32_t bos, int32_t eos,
                                 kvq_tokenizer **out, kvq_err *err);

void kvq_tokenizer_free(kvq_tokenizer *t); /* NULL is fine */

/* ---- loaders ----------------------------------------------------------------------- */

/* From GGUF metadata (tokenizer.ggml.*): model "llama" -> SPM, "gpt2" -> byte-level BPE
 * (tokenizer.ggml.pre chooses the split: "llama3"/"llama-bpe" -> LLAMA3 with 3 digits
 * and ignore_merges, "qwen2" -> LLAMA3 with 1 digit, "gpt-2"/"default"/absent -> GPT2,
 * anything else -> GPT2 with a warning through cb). The tokenizer copies what it needs:
 * g may be closed afterwards. label (may be NULL) names the file in messages.
 * Errors: KVQ_E_NOT_FOUND (no tokenizer.ggml.model), KVQ_E_UNSUPPORTED (another model,
 * named), KVQ_E_CORRUPT (tokens/scores/token_type/merges of the wrong type or length,
 * ids out of range), plus those of kvq_tokenizer_new. */
kvq_status kvq_tokenizer_from_gguf(const kvq_gguf *g, const char *label,
                                   const kvq_callbacks *cb, kvq_tokenizer **out, kvq_err *err);

/* From a HF tokenizer.json (model.type "BPE"; model.vocab, model.merges as "a b" strings
 * or [a, b] pairs, added_tokens). BOS/EOS and add_bos come from tokenizer_config.json
 * next to it when present (bos_token / eos_token as strings or {"content": ...}), else
 * from the post_processor template, else from well-known names (<s>, </s>,
 * <|begin_of_text|>, <|end_of_text|>, <|endoftext|>).
 * Errors: KVQ_E_NOT_FOUND, KVQ_E_IO, KVQ_E_BAD_JSON (not JSON), KVQ_E_UNSUPPORTED
 * (another model type, BPE with a word prefix/suffix, neither ByteLevel nor '▁'
 * handling), KVQ_E_CORRUPT (vocab/merges/added_tokens of the wrong shape; an id outside
 * [0, KVQ_TOKENIZER_MAX_VOCAB); a "sparse vocabulary": the largest id is at least
 * 2 x (model.vocab + added_tokens entries) + 1024, since every id up to the largest is
 * allocated, holes included), KVQ_E_TOO_LARGE. */
kvq_status kvq_tokenizer_from_hf_json(const char *path, const kvq_callbacks *cb,
                                      kvq_tokenizer **out, kvq_err *err);
/* Same from memory: json[0..len) is tokenizer.json, config (NUL-terminated, may be
 * NULL) is tokenizer_config.json. label names the source in messages. */
kvq_status kvq_tokenizer_from_hf_json_memory(const char *json, size_t len, const char *config,
                                             const char *label, const kvq_callbacks *cb,
                                             kvq_tokenizer **out, kvq_err *err);

/* From llama2.c's tokenizer.bin (tok512.bin): int32 max_token_length, then per token
 * f32 score, int32 length, bytes; the count is whatever the file holds. llama2.c
 * exported '▁' as ' ' and BOS/EOS as "\n<s>\n"/"\n</s>\n": both spellings are
 * normalized back to '▁', "<s>", "</s>", so the result equals the GGUF vocabulary.
 * Token 0 is <unk>, 1 BOS, 2 EOS (llama2.c's convention); add_space_prefix = 1.
 * Errors: KVQ_E_NOT_FOUND, KVQ_E_IO, KVQ_E_TRUNCATED_HEADER (< 4 bytes),
 * KVQ_E_TRUNCATED_DATA (a record cut short), KVQ_E_CORRUPT (negative length, no
 * tokens, max_token_length < 1), KVQ_E_TOO_LARGE. */
kvq_status kvq_tokenizer_from_llama2c(const char *path, kvq_tokenizer **out, kvq_err *err);
kvq_status kvq_tokenizer_from_llama2c_memory(const void *data, size_t size, const char *label,
                                             kvq_tokenizer **out, kvq_err *err);

/* Picks the loader from the path: a directory -> DIR/tokenizer.json; "*.json" -> HF;
 * a file starting with "GGUF" -> GGUF; anything else -> llama2.c tokenizer.bin. */
kvq_status kvq_tokenizer_load(const char *path, const kvq_callbacks *cb, kvq_tokenizer **out,
                              kvq_err *err);

/* ---- queries ----------------------------------------------------------------------- */

kvq_tokenizer_kind kvq_tokenizer_kind_of(const kvq_tokenizer *t);
const char *kvq_tokenizer_model(const kvq_tokenizer *t); /* "llama", "gpt2", "hf-bpe", ... */
uint32_t kvq_tokenizer_n_vocab(const kvq_tokenizer *t);
int32_t kvq_tokenizer_bos(const kvq_tokenizer *t);      /* -1 = none */
int32_t kvq_tokenizer_eos(const kvq_tokenizer *t);      /* -1 = none */
int32_t kvq_tokenizer_unk(const kvq_tokenizer *t);      /* -1 = none */
int kvq_tokenizer_add_bos(const kvq_tokenizer *t);      /* the model expects BOS */
kvq_pretok kvq_tokenizer_pretok(const kvq_tokenizer *t, uint32_t *max_digits);

/* The token's string as the model stores it ("▁Once", "Ġthe", "<0x0A>", "<s>"),
 * NUL-terminated, owned by t; *len (may be NULL) gets its length. NULL when id is out
 * of range (or, for the IDS kind, always). */
const char *kvq_tokenizer_token_str(const kvq_tokenizer *t, int32_t id, size_t *len);
kvq_token_type kvq_tokenizer_token_type(const kvq_tokenizer *t, int32_t id); /* 0 if bad id */
float kvq_tokenizer_score(const kvq_tokenizer *t, int32_t id);   /* 0 if none */
/* Id of the token whose stored string is s[0..len), or -1. */
int32_t kvq_tokenizer_find(const kvq_tokenizer *t, const char *s, size_t len);

/* The bytes a token stands for in text: byte tokens give their byte, '▁' gives ' ',
 * byte-level tokens are mapped back to raw bytes, CONTROL and UNKNOWN tokens give ""
 * (IDS kind: "<ID>" is not available here, so ""). Not NUL-terminated in general
 * (a piece may contain a 0 byte). Owned by t. NULL when id is out of range. */
const char *kvq_tokenizer_piece(const kvq_tokenizer *t, int32_t id, size_t *len);

/* ---- encode / decode --------------------------------------------------------------- */

enum {
    KVQ_ENCODE_BOS = 1u << 0,       /* prepend BOS (KVQ_E_INVALID_ARG if there is none) */
    KVQ_ENCODE_EOS = 1u << 1,       /* append EOS (same) */
    KVQ_ENCODE_NO_PREFIX = 1u << 2  /* no dummy prefix (text continues earlier text) */
};

/* Tokenizes text[0..len) (any bytes; NUL is an ordinary byte), with the dummy prefix
 * when kvq_tokenizer_adds_prefix(t, text, len, flags) says so. *ids is malloc'd
 * (free()), *n its length; empty text gives only the requested BOS/EOS (possibly
 * nothing, *ids then NULL). Cost: O(len log len) time; SPM and metaspace merge over the
 * whole text at once and need up to about 100 bytes of scratch per byte of text, byte-level
 * BPE only per pre-token.
 * Errors: KVQ_E_UNSUPPORTED (IDS kind), KVQ_E_INVALID_ARG (a byte that has neither a
 * token nor a fallback and no unknown token; BOS/EOS asked for but absent),
 * KVQ_E_TOO_LARGE (len >= 2^31), KVQ_E_NOMEM. */
kvq_status kvq_tokenizer_encode(const kvq_tokenizer *t, const char *text, size_t len,
                                unsigned flags, int32_t **ids, size_t *n, kvq_err *err);

enum {
    KVQ_DECODE_KEEP_PREFIX = 1u << 0, /* keep the leading space the dummy prefix added */
    KVQ_DECODE_SPECIAL = 1u << 1      /* render CONTROL/UNKNOWN tokens as their string */
};

/* 1 when kvq_tokenizer_encode(t, text, len, flags, ...) adds the dummy prefix space:
 * the tokenizer has add_space_prefix, len > 0, flags lacks KVQ_ENCODE_NO_PREFIX, and,
 * for byte-level BPE, text[0] is not ' ' (HF's ByteLevel add_prefix_space leaves such
 * text alone, so "x" and " x" give the same ids there). Else 0; always 0 for IDS. */
int kvq_tokenizer_adds_prefix(const kvq_tokenizer *t, const char *text, size_t len,
                              unsigned flags);

/* Concatenates the pieces of ids[0..n) into a malloc'd, NUL-terminated buffer (free());
 * *len (may be NULL) gets its length. With a dummy prefix (add_space_prefix), one
 * leading space of the output is dropped unless KVQ_DECODE_KEEP_PREFIX.
 * Round trip: with ids = encode(s, eflags) and
 *   dflags = kvq_tokenizer_adds_prefix(t, s, len, eflags) ? 0 : KVQ_DECODE_KEEP_PREFIX,
 * decode(ids, dflags) == s whenever every id is a NORMAL or BYTE token other than the
 * unknown id (the unknown fallback loses the text) and, for SPM/metaspace, neither s
 * nor the output has a '▁' (a '▁' in s decodes to ' '; in a vocabulary without a '▁'
 * token, an escaped space may fall back to the bytes of '▁', which decode to '▁').
 * In particular decode(encode(s, 0), 0) == s for every such s except byte-level BPE with
 * add_space_prefix and s starting with ' ', where the ids cannot tell whether a
 * space was added: that text needs KVQ_DECODE_KEEP_PREFIX (as the formula gives).
 * Errors: KVQ_E_INVALID_ARG (an id out of range, naming its index), KVQ_E_NOMEM. */
kvq_status kvq_tokenizer_decode(const kvq_tokenizer *t, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len, kvq_err *err);

/* ---- pre-tokenized files ------------------------------------------------------------ */

/* Reads a file of little-endian int32 token ids into a malloc'd array (free()).
 * n_vocab > 0 checks every id is in [0, n_vocab). Errors: KVQ_E_NOT_FOUND, KVQ_E_IO,
 * KVQ_E_CORRUPT (size not a multiple of 4, a negative id: message gives the index),
 * KVQ_E_MISMATCH (an id >= n_vocab), KVQ_E_NOMEM. */
kvq_status kvq_ids_read(const char *path, uint32_t n_vocab, int32_t **ids, size_t *n,
                        kvq_err *err);

/* The pre-token split alone: writes the end offsets of the pre-tokens of text[0..len)
 * into ends (malloc'd, free()), *n of them; for tests and diagnostics. */
kvq_status kvq_pretokenize(kvq_pretok style, uint32_t max_digits, const char *text, size_t len,
                           size_t **ends, size_t *n, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_TOKENIZER_H */
