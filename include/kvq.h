/*
 * kvq.h — the public API of libkvq (umbrella header).
 *
 * Dependency order, bottom up (each layer uses only the ones below it):
 *   common      status codes, errors, callbacks, checked parsing, files, RNG
 *   formats     half precision, safetensors, GGUF, .kvq artifact
 *   model       model loading (GGUF, HF), RoPE, forward pass, tokenizers
 *   calib       corpus, capture, capture directory, merge
 *   cholesky    query moments, H, Cholesky factors
 *   kmeans      k-means++ and the codebook methods (CPU and CUDA backends)
 *   runtime     KV cache with codes, selectors, retrieval attention
 *   thresholds  LeanKV, PATS and budget profiling
 *   pipeline    kvq calibrate: every stage in order, resumable
 *
 * Two tiers (docs/api.md). The stable API, installed by `make install`, is what this
 * header includes by default: errors and callbacks (kvq/common.h), the artifact
 * (kvq/artifact.h: open, describe, tensors, codebooks), calibrate (kvq/calibrate.h:
 * kvq_calibrate_files), evaluation (kvq/eval.h: kvq_eval_files) and the embedding
 * engine (kvq/engine.h). Plain structs, caller-owned buffers, no callback needed.
 * Everything else (tokenizer, GGUF, safetensors, model, corpus, capture, k-means,
 * runtime, thresholds, the stages' full parameters) is the unstable tier: compiled in
 * with KVQ_UNSTABLE_API defined before any kvq header (the CLI, tests and benchmarks do,
 * from the Makefile), installed only by `make install-unstable`, and free to change in
 * any release. kvq/util.h is internal (never installed).
 */
#ifndef KVQ_H
#define KVQ_H

#include "kvq/common.h"
#include "kvq/artifact.h"
#include "kvq/calibrate.h"
#include "kvq/eval.h"
#include "kvq/engine.h"

#ifdef KVQ_UNSTABLE_API
#include "kvq/dist.h"
#include "kvq/half.h"
#include "kvq/safetensors.h"
#include "kvq/gguf.h"
#include "kvq/quant.h"
#include "kvq/artifact_summary.h"
#include "kvq/rope.h"
#include "kvq/kmeans.h"
#include "kvq/tokenizer.h"
#include "kvq/corpus.h"
#include "kvq/model_id.h"
#include "kvq/model.h"
#include "kvq/perplexity.h"
#include "kvq/capture_dir.h"
#include "kvq/capture.h"
#include "kvq/moments.h"
#include "kvq/codebook.h"
#include "kvq/fit.h"
#include "kvq/thresholds.h"
#include "kvq/runtime.h"
#include "kvq/kvcache.h"
#endif

#endif
