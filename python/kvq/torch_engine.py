"""kvq's retrieval attention in pure torch (the ``--backend torch`` of kvq.hf.retrieval):
the selection the C engine (kvq/engine.h) makes, written again from docs/runtime.md "One
step" for any device torch runs on, with the C engine's defaults (kvq_engine_seq_create):

- the cache: pre-RoPE keys and values rounded to f16 (``cache_f16``), each key's code
  (nearest centroid of z = k L in the codebook's space, kvq_codebook_encode) and its
  1-bit residual from the key-space centroid (signs of k - c and the mean |k - c|);
- per step, query position i seeing n tokens, per KV head: sinks [0, S), window
  [n - w, n) (w, b: the artifact's wrope), candidates between; budget K = ceil(f n);
  K2 = K + ceil(0.08 nc) for the exact rerank; the codebook stage keeps
  min(nc, max(ceil(64 K2), ...)) = every candidate at the defaults; the residual stage
  scores each candidate by max over the group's heads h of LUT_h[code] + a (q_h R_b . s)
  (LUT_h: the head's query rotated by the mean rotation over the candidates'
  distances, ``--score-pos mean``, against the f16 table of the key-space codebook) and
  keeps K2; the exact rerank scores (sum_h q_h R_b) . k_j and keeps K; equal scores go
  to the earlier token;
- exact attention over sinks + selection + window under wrope: the window (and sinks
  inside it) with exact RoPE, every other attended token with q R_b . k_j.

Only what the engine exposes is implemented: single-group codebooks (vq, qavq), wrope,
group sum with the residual stage by the best head. Results are the C engine's up to
float rounding (the selection: the same indices; tests compare them)."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from .artifact import Artifact
from .errors import InvalidArgumentError, UnsupportedError
from .model import ModelSpec

RERANK_EXTRA = 0.08  # kvq_retrieval_params_default: rerank_extra
RESID_WIDE = 64.0    # resid_wide
RESID_SHARE = 1.0    # resid_share
F16_MAX = 65504.0


def rope_freqs(spec: ModelSpec) -> np.ndarray:
    """theta_m (float64) as kvq_rope_freqs (model/rope.c), scalings none/linear/llama3."""
    d = spec.head_dim
    out = np.empty(d // 2)
    for m in range(d // 2):
        t = math.pow(spec.rope_base, -2.0 * m / d)
        if spec.rope_scaling == "linear":
            t /= spec.rope_factor
        elif spec.rope_scaling == "llama3":
            wl = 2.0 * math.pi / t
            low, high = spec.rope_original_max_pos / spec.rope_low_freq_factor, \
                spec.rope_original_max_pos / spec.rope_high_freq_factor
            if wl > low:
                t /= spec.rope_factor
            elif wl >= high:
                s = (spec.rope_original_max_pos / wl - spec.rope_low_freq_factor) / \
                    (spec.rope_high_freq_factor - spec.rope_low_freq_factor)
                t = (1.0 - s) * t / spec.rope_factor + s * t
        out[m] = t
    return out


def budget_tokens(budget: Union[int, float], n: int) -> int:
    """kvq_budget_tokens: a count, or ceil(f n) within [1, n]."""
    if n <= 0:
        return 0
    if isinstance(budget, int) and not isinstance(budget, bool):
        return budget
    if budget >= 1.0:
        return n
    return min(max(int(math.ceil(budget * n)), 1), n)


class TorchEngine:
    """An artifact's codebooks on a torch device, for a model (checked as
    kvq_engine_open checks it: shape, RoPE, fingerprint; MismatchError otherwise)."""

    def __init__(self, artifact: Union[str, Artifact], model: ModelSpec, device: Any = "cpu",
                 accept_model_mismatch: bool = False) -> None:
        import torch

        a = artifact if isinstance(artifact, Artifact) else Artifact(artifact)
        self.weights_note = a.check_model(model, accept_mismatch=accept_model_mismatch)
        if a.groups != 1 or a.method not in ("vq", "qavq"):
            raise UnsupportedError(f"{a.path}: method {a.method} with {a.groups} groups: the torch back end "
                                   "implements single-group vq and qavq codebooks", 400)
        missing = [l for l in range(model.n_layers) if l not in a.layers]
        if missing:
            raise UnsupportedError(f"{a.path}: no codebooks for layers {missing}", 400)
        self.model, self.device, self.artifact = model, torch.device(device), a
        self.window, self.wrope_b = a.wrope
        theta = rope_freqs(model)
        self.theta = theta
        ang = self.wrope_b * theta
        self.bcos = torch.tensor(np.cos(ang).astype(np.float32), device=self.device)
        self.bsin = torch.tensor(np.sin(ang).astype(np.float32), device=self.device)
        self.L: Dict[Tuple[int, int], Any] = {}
        self.Cz: Dict[Tuple[int, int], Any] = {}
        self.cz_norm: Dict[Tuple[int, int], Any] = {}
        self.C: Dict[Tuple[int, int], Any] = {}
        self.table: Dict[Tuple[int, int], Tuple[Any, float]] = {}
        for l in range(model.n_layers):
            for h in range(model.n_kv_heads):
                cz = a.codebook_z(l, h).astype(np.float64) if a.method == "qavq" else a.codebook(l, h).astype(np.float64)
                if a.method == "qavq":
                    L, Li = a.cholesky(l, h)
                    c = (cz @ Li.astype(np.float64)).astype(np.float32)  # kvq_codebook_key_codebook
                    self.L[l, h] = torch.tensor(L.astype(np.float64), device=self.device)
                else:
                    c = cz.astype(np.float32)
                    self.L[l, h] = None
                self.Cz[l, h] = torch.tensor(cz, device=self.device)
                self.cz_norm[l, h] = (self.Cz[l, h] ** 2).sum(1)
                self.C[l, h] = torch.tensor(c, device=self.device)
                m = float(np.abs(c).max())
                scale = 1.0
                while m / scale > F16_MAX and scale <= 2.0 ** 40:
                    scale *= 2.0
                # kvq_rk_table: f16 of the key-space centroids / scale (a power of two)
                t16 = torch.tensor((c * np.float32(1.0 / scale)).astype(np.float16).astype(np.float32),
                                   device=self.device)
                self.table[l, h] = (t16, scale)

    def sequence(self, budget: Union[int, float] = 0.06, sink: Optional[int] = None, window: int = 0,
                 cache_f16: bool = True, **_: Any) -> "TorchSequence":
        """A sequence (as kvq.Engine.sequence): budget a count or a fraction of the visible
        tokens, sink (default 4), window (0: the artifact's)."""
        return TorchSequence(self, budget, 4 if sink is None else int(sink), window or self.window, cache_f16)

    def close(self) -> None:
        pass


def _rotate(x: Any, cs: Any, sn: Any, interleaved: bool) -> Any:
    """Pairwise rotation of x [..., d] by (cs, sn) [d/2] (kvq_rk_rotate), in x's dtype."""
    import torch
    d = x.shape[-1]
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cs - x1 * sn, x0 * sn + x1 * cs], dim=-1).reshape(x.shape)
    x0, x1 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([x0 * cs - x1 * sn, x0 * sn + x1 * cs], dim=-1)


def _rowdot(a: Any, b: Any) -> Any:
    """Dot products along the last axis, each row reduced alone in float64 (so equal rows
    give bit-equal scores, whatever their place in a batch: the ties of equal keys go to
    the earlier token as in the C engine), rounded to float32."""
    return (a.double() * b.double()).sum(-1).float()


def _topk_earliest(scores: Any, k: int) -> Any:
    """Indices of the k largest scores, equal scores to the earlier index, ascending."""
    import torch
    order = torch.sort(-scores, stable=True).indices[:k]
    return torch.sort(order).values


class TorchSequence:
    """One sequence's cache and steps (the API of kvq.Sequence, torch tensors or numpy in;
    torch tensors out on the engine's device)."""

    def __init__(self, eng: TorchEngine, budget: Union[int, float], sink: int, window: int,
                 cache_f16: bool) -> None:
        self.e, self.budget, self.sink, self.window, self.f16 = eng, budget, sink, window, cache_f16
        self.reset()

    def reset(self) -> None:
        """Forgets the tokens."""
        n = self.e.model.n_layers
        self.k: List[List[Any]] = [[] for _ in range(n)]
        self.v: List[List[Any]] = [[] for _ in range(n)]
        self.codes: List[List[Any]] = [[] for _ in range(n)]
        self.signs: List[List[Any]] = [[] for _ in range(n)]
        self.scale: List[List[Any]] = [[] for _ in range(n)]
        self.pos: List[List[int]] = [[] for _ in range(n)]
        self._cat: Dict[int, Tuple[int, Any, Any, Any, Any, Any]] = {}

    def length(self, layer: int = 0) -> int:
        return len(self.pos[layer])

    def close(self) -> None:
        self.reset()

    def _tensor(self, x: Any) -> Any:
        import torch
        t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        return t.to(self.e.device, torch.float32)

    def append(self, layer: int, k: Any, v: Any, pos: Optional[Any] = None) -> None:
        """Rows k, v [n, n_kv_heads, head_dim] (pre-RoPE) at positions pos (default: next)."""
        import torch
        m = self.e.model
        if not 0 <= layer < m.n_layers:
            raise InvalidArgumentError(f"kvq torch back end: layer {layer} outside [0, {m.n_layers})")
        k, v = self._tensor(k), self._tensor(v)
        if k.dim() != 3 or k.shape[1:] != (m.n_kv_heads, m.head_dim) or v.shape != k.shape:
            raise InvalidArgumentError(f"kvq torch back end: k {tuple(k.shape)}, v {tuple(v.shape)}: "
                                       f"expected [n, {m.n_kv_heads}, {m.head_dim}] each")
        if self.f16:
            k, v = k.half().float(), v.half().float()
        n0 = len(self.pos[layer])
        p = list(range(n0, n0 + k.shape[0])) if pos is None else [int(x) for x in np.asarray(pos).ravel()]
        codes, signs, scales = [], [], []
        for h in range(m.n_kv_heads):
            kh = k[:, h].double()
            L = self.e.L[layer, h]
            z = (kh @ L) if L is not None else kh  # kvq_codebook_encode: z = k L
            dist = (z * z).sum(1, keepdim=True) - 2 * z @ self.e.Cz[layer, h].T + self.e.cz_norm[layer, h]
            c = torch.argmin(dist, dim=1)  # the first of equal distances
            r = k[:, h] - self.e.C[layer, h][c]  # residual from the key-space centroid (f32)
            codes.append(c)
            signs.append(torch.where(r >= 0, 1.0, -1.0).to(torch.float32))
            scales.append(r.double().abs().mean(1).float())
        self.k[layer].append(k)
        self.v[layer].append(v)
        self.codes[layer].append(torch.stack(codes, 1))
        self.signs[layer].append(torch.stack(signs, 1))
        self.scale[layer].append(torch.stack(scales, 1))
        self.pos[layer] += p

    def _cached(self, layer: int):
        import torch
        n = len(self.pos[layer])
        hit = self._cat.get(layer)
        if hit is None or hit[0] != n:
            for store in (self.k, self.v, self.codes, self.signs, self.scale):
                store[layer] = [torch.cat(store[layer])]
            hit = (n, self.k[layer][0], self.v[layer][0], self.codes[layer][0], self.signs[layer][0],
                   self.scale[layer][0])
            self._cat[layer] = hit
        return hit[1:]

    def select(self, layer: int, h: int, q: Any, qb: Any, n: int, s_end: int, w_beg: int, i: int) -> Any:
        """The candidates KV head h keeps (token indices ascending); q, qb [gs, d]."""
        import torch
        K, _, codes, signs, scale = self._cached(layer)
        nc = w_beg - s_end
        kb = budget_tokens(self.budget, n)
        cand = torch.arange(s_end, w_beg, device=self.e.device)
        if kb >= nc:
            return cand
        k2 = min(nc, kb + int(math.ceil(RERANK_EXTRA * nc)))
        k1 = k2
        if k2 < nc:  # kvq_rt_resid_count (1 bit: the share's cap is the candidates)
            want, cap = math.ceil(RESID_WIDE * k2), math.ceil(RESID_SHARE * nc)
            want = max(cap, k2) if want > cap else want
            k1 = nc if want >= nc else int(want)
        pos = self.pos[layer]
        a, b = i - pos[w_beg - 1], i - pos[s_end]
        a, b = min(a, b), max(a, b)
        cs, sn = self._mean_rotation(a, b)
        t16, tscale = self.e.table[layer, h]
        qm = _rotate(q, cs, sn, self.e.model.rope_interleaved)             # [gs, d] scoring queries
        luts = (qm.double() * tscale).float() @ t16.T                      # [gs, K]
        cc = codes[s_end:w_beg, h]
        if k1 < nc:  # the first stage: the group's summed scoring query
            first = (qm.sum(0).double() * tscale).float() @ t16.T
            cand = cand[_topk_earliest(first[cc], k1)]
            cc = codes[cand, h]
        if k1 > k2:  # the residual stage, by the best head
            sc = luts[:, cc] + scale[cand, h][None] * _rowdot(signs[cand, h][None], qb[:, None])  # [gs, m]
            cand = cand[_topk_earliest(sc.max(0).values, k2)]
        if k2 > kb:  # the exact rerank: (sum q R_b) . k, or the heads' sum from 4 heads on
            kk = K[cand, h]
            ex = _rowdot(kk, qb.sum(0)) if qb.shape[0] < 4 else _rowdot(kk[None], qb[:, None]).sum(0)
            cand = cand[_topk_earliest(ex, kb)]
        return cand

    def _mean_rotation(self, a: int, b: int) -> Tuple[Any, Any]:
        """kvq_rt_mean_rotation: per pair, the mean of R_delta over distances [a, b]."""
        import torch
        t = self.e.theta
        n, c = float(b - a + 1), 0.5 * (a + b)
        s2 = np.sin(0.5 * t)
        with np.errstate(divide="ignore", invalid="ignore"):
            damp = np.where(np.abs(s2) < 1e-12, 1.0, np.sin(0.5 * n * t) / (n * s2))
        cs = (damp * np.cos(c * t)).astype(np.float32)
        sn = (damp * np.sin(c * t)).astype(np.float32)
        return torch.tensor(cs, device=self.e.device), torch.tensor(sn, device=self.e.device)

    def decode(self, layer: int, q: Any, k: Any, v: Any, pos: Optional[int] = None) -> Tuple[Any, List[Any]]:
        """One decode step (as kvq.Sequence.decode): appends k, v [n_kv_heads, head_dim] at
        pos, attends q [n_heads, head_dim] by retrieval. Returns (out [n_heads, head_dim],
        selected: per KV head the chosen candidate tokens, ascending; empty when every
        token was attended)."""
        import torch
        m = self.e.model
        q = self._tensor(q)
        if q.shape != (m.n_heads, m.head_dim):
            raise InvalidArgumentError(f"kvq torch back end: q has shape {tuple(q.shape)}, "
                                       f"expected {(m.n_heads, m.head_dim)}")
        i = len(self.pos[layer]) if pos is None else int(pos)
        self.append(layer, self._tensor(k)[None], self._tensor(v)[None], [i])
        K, V, _, _, _ = self._cached(layer)
        n = K.shape[0]
        gs, d = m.n_heads // m.n_kv_heads, m.head_dim
        s_end = min(self.sink, n)
        w_beg = max(n - self.window, s_end)
        il = m.rope_interleaved
        qg = q.view(m.n_kv_heads, gs, d)
        qb = _rotate(qg, self.e.bcos, self.e.bsin, il)
        ang = torch.tensor(i * self.e.theta, device=self.e.device)
        qi = _rotate(qg, torch.cos(ang).float(), torch.sin(ang).float(), il)
        pos_t = torch.tensor(self.pos[layer], device=self.e.device, dtype=torch.float64)
        out = torch.empty(m.n_heads, d, device=self.e.device)
        selected = []
        scl = 1.0 / math.sqrt(d)
        for h in range(m.n_kv_heads):
            sel = self.select(layer, h, qg[h], qb[h], n, s_end, w_beg, i) if w_beg > s_end else \
                torch.zeros(0, dtype=torch.long, device=self.e.device)
            selected.append(sel)
            sinks = torch.arange(0, s_end, device=self.e.device)
            near = torch.arange(w_beg, n, device=self.e.device)
            far_s, near_s = sinks[sinks < n - self.window], sinks[sinks >= n - self.window]
            far = torch.cat([far_s, sel])
            near = torch.cat([near_s, near])
            lf = (qb[h] @ K[far, h].T) * scl                                  # q R_b . k_j
            a = pos_t[near][:, None] * torch.tensor(self.e.theta, device=self.e.device)[None]
            kr = _rotate(K[near, h], torch.cos(a).float(), torch.sin(a).float(), il)
            ln = (qi[h] @ kr.T) * scl                                          # q R_i . k_j R_j
            p = torch.softmax(torch.cat([lf, ln], 1), dim=1)
            out[h * gs:(h + 1) * gs] = p @ V[torch.cat([far, near]), h]
        return out, selected
