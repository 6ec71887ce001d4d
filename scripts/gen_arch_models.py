#!/usr/bin/env python3
"""Tiny random-weight qwen3, gemma3, gemma2 and phi3 models, and what transformers
computes with them: the expected values of tests/test_archs.c.

What it makes (tests/data/archs/, each model under 1 MB)
    <arch>/            an HF directory: config.json in the form the released checkpoints
                       use (rope_theta, rope_scaling, rope_local_base_freq,
                       sliding_window_pattern: what llama.cpp's converter and kvq read),
                       model.safetensors (F32), tokenizer.model (gemma2, gemma3, phi3: a
                       SentencePiece BPE with byte fallback trained here on
                       tests/data/tok_corpus.jsonl) or tokenizer.json (qwen3: a byte-level
                       BPE trained here with the qwen2 pre-tokenizer).
    <arch>.gguf        the same model converted by llama.cpp's own convert_hf_to_gguf.py
                       (--outtype f32), from the llama-cpp-python 0.3.16 sdist.
    <arch>.config_v5.json
                       the same configuration as transformers 5 writes it
                       (save_pretrained: rope_parameters, layer_types), which kvq reads too.
    <arch>.tok.tsv     the ids of every tests/data/tok_corpus.jsonl document (no BOS, no
                       special tokens parsed) from the tokenizer's own implementation:
                       sentencepiece on tokenizer.model (gemma2, gemma3: no dummy prefix,
                       as gemma's; phi3: with it, as llama's), HF tokenizers on
                       tokenizer.json (qwen3); lines "id<TAB>count<TAB>fnv1a64" (FNV-1a 64
                       over the ids as little-endian int32, as tests/data/README.md says).
    <arch>.q8_0.gguf   the converter's Q8_0 file (--outtype q8_0: matrices Q8_0, norms F32)
    <arch>.q8_0.json   transformers' logits and 48 greedy ids with the weights the gguf
                       package dequantizes from it (norms back to w for gemma: the file
                       holds 1 + w), same prompt: what kvq must compute from the Q8_0 file
    <arch>.llamacpp.json
                       llama.cpp's logits for the prompt and its 48 greedy ids on <arch>.gguf
                       (llama-cpp-python 0.3.16, F32 KV cache): qwen3, gemma3, gemma2 (its
                       vocabulary loader refuses the phi3 file: "unordered_map::at")
    <arch>.json        transformers' values (float32, eager attention):
                       "tokens" (a 16-token prompt), "logits" ([16][vocab], every
                       position), "greedy" (48 ids: generate(do_sample=False)),
                       "min_margin" (smallest top1 - top2 logit gap over the prompt and
                       the greedy steps: far from a tie), "q" / "k" ([layer][pos][head *
                       head_dim], pre-RoPE, after qwen3's / gemma3's q/k norm: the
                       outputs of the modules transformers applies before
                       apply_rotary_pos_emb, caught with forward hooks), "layers" (per
                       layer: RoPE base, scaling factor, window as transformers' config
                       gives them), and "versions".

The shapes are each architecture's real configuration scaled down: qwen3 (head_dim 32 >
dim / n_heads, GQA 4:2), gemma3 (6 layers: 5 sliding-window layers with RoPE base 10000,
then a global one with base 1e6 and linear scaling 8 as Gemma-3-4B; q/k norm; window 8;
query_pre_attn_scalar = head_dim as in the 1B/4B), gemma2 (window 8 on every other
layer, attention softcap 5 and final softcap 3: small enough to matter with these
weights), phi3 (MHA, fused qkv and gate_up, sliding_window 2047 as Phi-3-mini: longer
than any test sequence, since llama.cpp ignores phi3's window). Weights: matrices
N(0, 1/in), embeddings N(0, 1) (gemma: N(0, 1/dim), as gemma scales them by
sqrt(dim)), norm weights 1 + 0.1 N (gemma: 0.1 N, as (1 + w)).

The converter reads config.json through transformers' AutoConfig(...).to_dict(); with
transformers 5 that dict has rope_parameters instead of the rope_theta / rope_scaling the
converter (written for transformers 4) looks for, and it would silently drop them. Its
own fallback, reading config.json as it is, is what it is told to do here.

The qwen3 GGUF: the converter identifies a BPE pre-tokenizer by hashing how the
tokenizer splits a fixed text; a tokenizer trained here has no known hash, so
get_vocab_base_pre is told "qwen2" (the pre-tokenizer the tokenizer.json declares).

How to rerun (a minute on 2 cores; needs torch, transformers, safetensors, tokenizers,
sentencepiece, numpy, gguf, and the llama-cpp-python sdist unpacked):
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.16 (then unpack)
    python3 scripts/gen_arch_models.py --llama-cpp DIR/vendor/llama.cpp [-o tests/data/archs]
Deterministic for one torch / transformers version (seeded). Never made with kvq.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

VOCAB = 512
PROMPT = 16
GREEDY = 48
SEED = 1234

CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None, "attention_bias": False,
        "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": 3, "vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    "gemma3": {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 16, "sliding_window": 8, "sliding_window_pattern": 6,
        "attn_logit_softcapping": None, "final_logit_softcapping": None,
        "attention_bias": False, "tie_word_embeddings": True, "vocab_size": VOCAB,
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "torch_dtype": "float32",
    },
    "gemma2": {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "query_pre_attn_scalar": 16, "sliding_window": 8,
        "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
        "attention_bias": False, "tie_word_embeddings": True, "vocab_size": VOCAB,
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "torch_dtype": "float32",
    },
    "phi3": {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "hidden_act": "silu", "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": None, "sliding_window": 2047,
        "tie_word_embeddings": False, "vocab_size": VOCAB, "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float32",
    },
}


def corpus_text(root: Path) -> list[str]:
    with open(root / "tests/data/tok_corpus.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def train_spm(texts: list[str], out: Path, dummy_prefix: bool) -> None:
    """A SentencePiece BPE with byte fallback: ids 0..3 <pad> <eos> <bos> <unk> (gemma's
    order), the 256 byte tokens, then learned pieces, VOCAB in all."""
    import io

    import sentencepiece as spm

    # The lines of the corpus, fed from memory: a file input would be recorded in the
    # model's trainer spec under its temporary name, and the bytes would vary.
    lines = [ln for t in texts for ln in t.replace("\r", " ").split("\n")]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, model_type="bpe", vocab_size=VOCAB,
        byte_fallback=True, character_coverage=0.99, pad_id=0, eos_id=1, bos_id=2,
        unk_id=3, add_dummy_prefix=dummy_prefix, split_digits=True, num_threads=1,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        minloglevel=2, max_sentence_length=1 << 16)
    out.write_bytes(buf.getvalue())


def train_bpe(texts: list[str], out: Path) -> None:
    """A byte-level BPE tokenizer.json with the qwen2 pre-tokenizer regex."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
           r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 3, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.save(str(out))
    cfg = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
           "unk_token": None, "pad_token": "<|endoftext|>", "add_bos_token": False}
    (out.parent / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def init_weights(model: torch.nn.Module, arch: str, gen: torch.Generator) -> None:
    gemma = arch.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                base = 0.0 if gemma else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:  # gemma multiplies them by sqrt(dim)
                std = 1.0 / np.sqrt(p.shape[1]) if gemma else 1.0
                p.copy_(std * torch.randn(p.shape, generator=gen))
            elif p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(p.shape[1]))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def make_hf(arch: str, out: Path, texts: list[str]) -> None:
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(CONFIGS[arch], indent=2) + "\n")
    if arch == "qwen3":
        train_bpe(texts, out / "tokenizer.json")
    else:
        train_spm(texts, out / "tokenizer.model", dummy_prefix=arch == "phi3")
    cfg = AutoConfig.from_pretrained(out)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    init_weights(model, arch, torch.Generator().manual_seed(SEED))
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})


def qk_modules(model: torch.nn.Module, arch: str) -> list[tuple[Any, Any, bool]]:
    """Per layer: the modules whose outputs are the pre-RoPE q and k (fused: qkv_proj)."""
    mods = []
    for layer in model.model.layers:
        a = layer.self_attn
        if arch in ("qwen3", "gemma3"):
            mods.append((a.q_norm, a.k_norm, False))
        elif arch == "phi3":
            mods.append((a.qkv_proj, None, True))
        else:
            mods.append((a.q_proj, a.k_proj, False))
    return mods


def expected(arch: str, out: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cfg = model.config
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh
    gen = np.random.default_rng(SEED)
    tokens = [int(t) for t in gen.integers(4, VOCAB, PROMPT)]
    q: list[list[list[float]]] = []
    k: list[list[list[float]]] = []

    def flat(t: torch.Tensor, heads: int) -> list[list[float]]:
        # [1, T, heads, d] (qwen3 norms before the transpose), [1, heads, T, d]
        # (gemma3 after it) or [1, T, heads * d] (the projections)
        t = t.detach().float()[0]
        if t.ndim == 3 and t.shape[0] == heads and t.shape[1] == PROMPT:
            t = t.transpose(0, 1)
        return t.reshape(PROMPT, heads * hd).tolist()

    hooks = []
    for qm, km, fused in qk_modules(model, arch):
        li = len(q)
        q.append([])
        k.append([])
        if fused:
            def hk(_m, _i, o, li=li):
                q[li] = o[0, :, : nh * hd].tolist()
                k[li] = o[0, :, nh * hd: (nh + nkv) * hd].tolist()
            hooks.append(qm.register_forward_hook(hk))
        else:
            hooks.append(qm.register_forward_hook(
                lambda _m, _i, o, li=li: q.__setitem__(li, flat(o, nh))))
            hooks.append(km.register_forward_hook(
                lambda _m, _i, o, li=li: k.__setitem__(li, flat(o, nkv))))
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0]
    for h in hooks:
        h.remove()
    with torch.no_grad():
        g = model.generate(torch.tensor([tokens]), max_new_tokens=GREEDY, do_sample=False,
                           min_new_tokens=GREEDY, output_logits=True,
                           return_dict_in_generate=True, pad_token_id=0)
    greedy = [int(t) for t in g.sequences[0, PROMPT:]]
    steps = torch.cat([logits, torch.stack([s[0] for s in g.logits])])
    top2 = torch.topk(steps, 2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    layers = []
    # phi3 has no layer_types: transformers applies its sliding_window to every layer
    types = getattr(cfg, "layer_types", None) or [
        "sliding_attention" if getattr(cfg, "sliding_window", None) else "full_attention"] * len(q)
    for li, lt in enumerate(types):
        att = model.model.layers[li].self_attn
        layers.append({"type": lt, "window": cfg.sliding_window if lt == "sliding_attention" else 0,
                       "scaling": float(att.scaling)})
    import transformers
    return {
        "arch": arch, "tokens": tokens, "vocab_size": VOCAB, "head_dim": hd,
        "logits": [[float(x) for x in row] for row in logits.tolist()],
        "greedy": greedy, "min_margin": margin, "q": q, "k": k, "layers": layers,
        "rope_parameters": getattr(cfg, "rope_parameters", None),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


# The converter imports mistral_common (for Mistral's own formats only) at the top; an
# empty stand-in lets it load without that package.
STUB_MISTRAL = (
    "import types, transformers\n"
    "for n in ['mistral_common', 'mistral_common.tokens', 'mistral_common.tokens.tokenizers',\n"
    "          'mistral_common.tokens.tokenizers.base', 'mistral_common.tokens.tokenizers.multimodal',\n"
    "          'mistral_common.tokens.tokenizers.tekken', 'mistral_common.tokens.tokenizers.sentencepiece']:\n"
    "    m = types.ModuleType(n)\n"
    "    m.TokenizerVersion = m.Tekkenizer = m.SentencePieceTokenizer = object\n"
    "    m.DATASET_MEAN = m.DATASET_STD = None\n"
    "    sys.modules[n] = m\n")


def convert(arch: str, hf: Path, gguf_path: Path, llama_cpp: Path, outtype: str = "f32") -> None:
    """llama.cpp's converter, run in a child with gguf-py from the same sdist."""
    code = ((
        "import sys; sys.path.insert(0, %r); sys.path.insert(0, %r)\n" + STUB_MISTRAL +
        "import convert_hf_to_gguf as c\n"
        "c.TextModel.get_vocab_base_pre = lambda self, tok: 'qwen2'\n"
        "import json\n"
        "c.ModelBase.load_hparams = staticmethod(\n"
        "    lambda d, mistral=False: json.load(open(d / 'config.json', encoding='utf-8')))\n"
        "sys.argv = ['convert_hf_to_gguf.py', %r, '--outfile', %r, '--outtype', %r]\n"
        "c.main()\n") % (str(llama_cpp / "gguf-py"), str(llama_cpp), str(hf), str(gguf_path),
                          outtype))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{arch}: convert_hf_to_gguf.py failed:\n{r.stderr[-3000:]}")


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def write_tok_golden(root: Path, hf: Path, out: Path) -> None:
    with open(root / "tests/data/tok_corpus.jsonl", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    if (hf / "tokenizer.model").exists():
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(hf / "tokenizer.model"))
        enc = lambda t: sp.encode(t, out_type=int)  # noqa: E731
    else:
        from tokenizers import Tokenizer

        tk = Tokenizer.from_file(str(hf / "tokenizer.json"))
        enc = lambda t: tk.encode(t, add_special_tokens=False).ids  # noqa: E731
    lines = []
    for d in docs:
        ids = enc(d["text"])
        h = fnv1a64(np.asarray(ids, dtype="<i4").tobytes())
        lines.append(f"{d['id']}\t{len(ids)}\t{h:016x}")
    out.write_text("\n".join(lines) + "\n")


def write_v5_config(hf: Path, out: Path) -> None:
    from transformers import AutoConfig

    with tempfile.TemporaryDirectory() as d:
        AutoConfig.from_pretrained(hf).save_pretrained(d)
        out.write_text(Path(d, "config.json").read_text())


# GGUF tensor names -> HF names (gemma's ffn_norm is its pre-feedforward norm; phi3's
# ffn_up is the fused gate_up_proj).
GGUF_TO_HF = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_qkv": "self_attn.qkv_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "ffn_norm": "post_attention_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def hf_name(arch: str, name: str) -> str:
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight":
           "model.norm.weight", "output.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    _, bid, rest = name.split(".", 2)
    base = rest.rsplit(".", 1)[0]
    hf = GGUF_TO_HF[base]
    if arch.startswith("gemma") and base == "ffn_norm":
        hf = "pre_feedforward_layernorm"
    if arch == "phi3" and base == "ffn_up":
        hf = "mlp.gate_up_proj"
    return f"model.layers.{bid}.{hf}.weight"


def expected_quant(arch: str, hf: Path, gguf_path: Path) -> dict[str, Any]:
    """transformers over the weights the gguf package dequantizes from gguf_path."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    sd = model.state_dict()
    new = {}
    for t in GGUFReader(str(gguf_path)).tensors:
        w = dequantize(t.data, t.tensor_type).reshape(list(reversed(t.shape.tolist())))
        w = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
        name = hf_name(arch, t.name)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            w = w - 1.0
        assert sd[name].shape == w.shape, (name, sd[name].shape, w.shape)
        new[name] = w
    if model.config.tie_word_embeddings:
        new["lm_head.weight"] = new["model.embed_tokens.weight"]
    missing = set(sd) - set(new)
    assert not missing, missing
    model.load_state_dict(new)
    gen = np.random.default_rng(SEED)
    tokens = [int(t) for t in gen.integers(4, VOCAB, PROMPT)]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0]
        g = model.generate(torch.tensor([tokens]), max_new_tokens=GREEDY, do_sample=False,
                           min_new_tokens=GREEDY, output_logits=True,
                           return_dict_in_generate=True, pad_token_id=0)
    steps = torch.cat([logits, torch.stack([x[0] for x in g.logits])])
    top2 = torch.topk(steps, 2, dim=-1).values
    return {"arch": arch, "file": gguf_path.name, "tokens": tokens,
            "logits": logits.tolist(), "greedy": [int(x) for x in g.sequences[0, PROMPT:]],
            "min_margin": float((top2[:, 0] - top2[:, 1]).min())}


def llamacpp_values(gguf_path: Path, tokens: list[int]) -> dict[str, Any]:
    """llama.cpp's logits for every prompt position and its 48 greedy ids (argmax of the
    last logits, fed back one token at a time), F32 KV cache, one thread."""
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf_path), n_ctx=128, n_batch=128, logits_all=True,
                n_threads=1, verbose=False, type_k=0, type_v=0)
    llm.eval(tokens)
    v = llm.n_vocab()
    logits = [list(map(float, llm.scores[i][:v])) for i in range(len(tokens))]
    greedy = []
    last = np.asarray(llm.scores[len(tokens) - 1][:v])
    for _ in range(GREEDY):
        t = int(np.argmax(last))
        greedy.append(t)
        llm.eval([t])
        last = np.asarray(llm.scores[llm.n_tokens - 1][:v])
    return {"file": gguf_path.name, "tokens": tokens, "logits": logits, "greedy": greedy,
            "versions": {"llama_cpp_python": llama_cpp.__version__}}


def rounded(v: Any) -> Any:
    """Floats to 8 significant digits (float32's precision: the file stays small)."""
    if isinstance(v, float):
        return float(f"{v:.8g}")
    if isinstance(v, list):
        return [rounded(x) for x in v]
    if isinstance(v, dict):
        return {k: rounded(x) for k, x in v.items()}
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", required=True, type=Path,
                    help="vendor/llama.cpp of the unpacked llama-cpp-python sdist")
    ap.add_argument("-o", "--out", type=Path, default=Path("tests/data/archs"))
    ap.add_argument("--arch", action="append", choices=sorted(CONFIGS))
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    texts = corpus_text(root)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    for arch in args.arch or sorted(CONFIGS):
        hf = args.out / arch
        make_hf(arch, hf, texts)
        convert(arch, hf, args.out / f"{arch}.gguf", args.llama_cpp)
        write_v5_config(hf, args.out / f"{arch}.config_v5.json")
        write_tok_golden(root, hf, args.out / f"{arch}.tok.tsv")
        q8 = args.out / f"{arch}.q8_0.gguf"
        convert(arch, hf, q8, args.llama_cpp, "q8_0")
        (args.out / f"{arch}.q8_0.json").write_text(
            json.dumps(rounded(expected_quant(arch, hf, q8)), separators=(",", ":")) + "\n")
        if arch != "phi3":
            toks = [int(t) for t in np.random.default_rng(SEED).integers(4, VOCAB, PROMPT)]
            lc = llamacpp_values(args.out / f"{arch}.gguf", toks)
            (args.out / f"{arch}.llamacpp.json").write_text(
                json.dumps(rounded(lc), separators=(",", ":")) + "\n")
        exp = expected(arch, hf)
        (args.out / f"{arch}.json").write_text(json.dumps(rounded(exp), separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
