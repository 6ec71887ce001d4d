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
 * These are the toolchain's headers, installed by `make install`. kvq/util.h (checked
 * parsing, buffers, files, hashing, RNG) is internal: not installed, not included
 * here; the library, the kvq CLI, tests and benchmarks include it from the source
 * tree. An inference engine that embeds the runtime uses kvq/engine.h alone.
 */
#ifndef KVQ_H
#define KVQ_H

#include "kvq/common.h"
#include "kvq/dist.h"
#include "kvq/half.h"
#include "kvq/safetensors.h"
#include "kvq/gguf.h"
#include "kvq/quant.h"
#include "kvq/artifact.h"
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
#include "kvq/calibrate.h"
#include "kvq/engine.h"

#endif
