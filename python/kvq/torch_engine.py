"""kvq's retrieval attention in pure torch (the ``--backend torch`` of kvq.hf.retrieval):
the selection the C engine (kvq/engine.h) makes, written again from docs/runtime.md "One
step" and runtime/select/codebook/ for any device torch runs on, with the C engine's
settings (kvq_engine_seq_create: kvq_retrieval_params_default).

- the cache: pre-RoPE keys and values rounded to f16 (``cache_f16``); each key's code
  per group (kvq_codebook_encode: the nearest fit-space centroid of k (vq, pq), of
  z = k L (qavq, qapq) or of k R_p (vq-postrope)) and its 1-bit residual (signs and
  the mean |x|) of x = k - c (c the key-space centroid: vq, qavq) or of x = k (grouped
  codebooks and vq-postrope, which have none);
- per step, query position i seeing n tokens, every KV head at once: sinks [0, S),
  window [n - w, n) (w, b: the artifact's wrope), candidates between; budget K =
  ceil(f n); K2 = K + ceil(0.08 nc) for the exact rerank; the codebook's first stage
  keeps min(nc, max(ceil(64 K2), ...)) = every candidate; the residual stage scores each
  candidate by the best head of the group: LUT_h[code] + a (q_h R_b . s) (LUT_h from
  the f16 table of the key-space codebook and the head's query under the mean rotation
  over the candidates' distances, ``--score-pos mean``) when the key has a centroid and
  the LUTs fit the engine's scratch (G K <= its capacity, emulated here), else
  q_h R_b . (c + a s) (the reconstruction rule), keeping K2; the exact rerank scores
  (sum_h q_h R_b) . k_j (the heads' summed logits from 4 heads on) and keeps K; equal
  scores go to the earlier token; layers without codebooks attend every token;
- exact attention over sinks + selection + window under wrope: the window (and sinks
  inside it) with exact RoPE, every other attended token with q R_b . k_j.

Refused with UnsupportedError, naming it: an artifact recording a position mode or
scoring query other than (wrope, mean) (``positions.mode`` / ``positions.score``), a
model with sliding-window layers, a softcap or another score scale. Results are the C
engine's up to float rounding (the selection: the same indices; tests compare them).
Everything runs on the engine's device with torch operations; the only host values
per step are the token counts and positions (Python ints), so no device sync is
needed until the caller reads a result."""
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
METHODS = ("vq", "qavq", "pq", "qapq", "vq-postrope")
POSITIONS = ("wrope", "rope")
SCORES = ("rb", "mean", "bands")


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


def method_of(a: Artifact) -> str:
    """kvq_codebook_method_from_format: vq/pq and qavq/qapq told apart by the groups."""
    m = {"qa-vq": "qavq", "post-rope-vq": "vq-postrope"}.get(a.method, a.method)
    if m == "vq" and a.groups > 1:
        return "pq"
    if m == "qavq" and a.groups > 1:
        return "qapq"
    if m not in METHODS:
        raise UnsupportedError(f"{a.path}: method {a.method!r} has no codebooks the torch back end "
                               f"decodes ({', '.join(METHODS)})", 400)
    return m


def _check_attention(a: Artifact, model: ModelSpec) -> None:
    """What the C engine attends that this back end does not: refused by name."""
    meta = a.metadata
    num = {k: float(v) for k, v in meta.items() if k.startswith("model.attention.")
           and k.split(".")[-1] in ("sliding_window", "softcap", "scale")}
    if num.get("model.attention.sliding_window", 0) > 0:
        raise UnsupportedError(f"{a.path}: sliding-window layers: the torch back end attends "
                               "every layer by retrieval", 400)
    if num.get("model.attention.softcap", 0) > 0:
        raise UnsupportedError(f"{a.path}: attention softcap: not implemented by the torch back end", 400)
    sc = num.get("model.attention.scale", 0)
    if sc > 0 and abs(sc * math.sqrt(model.head_dim) - 1) > 1e-12:
        raise UnsupportedError(f"{a.path}: attention scale {sc}: the torch back end computes "
                               "1/sqrt(head_dim)", 400)


class _Layer:
    """One layer's codebooks, every KV head stacked (on the engine's device).
    W [H, G, K, dg] fit-space centroids (float64, for encoding) and their norms; L [H, d, d]
    (float64, query-aware); Linv [H, d, d] (float64, qapq's LUT query); C [H, K, d] the
    key-space codebook (float32; G = 1); tab [H, G, K, dg] the f16 table / its scale
    (float32 values) and tscale [H] the scales."""

    def __init__(self, a: Artifact, l: int, n_kv: int, method: str, dev: Any) -> None:
        import torch
        G, qa = a.groups, method in ("qavq", "qapq")
        W, C, Ls, Lis, tabs, scales = [], [], [], [], [], []
        for h in range(n_kv):
            w = (a.codebook_z(l, h) if qa else a.codebook(l, h)).astype(np.float32)
            w = w.reshape(G, w.shape[-2], w.shape[-1])
            if qa:
                L, Li = a.cholesky(l, h)
                Ls.append(L.astype(np.float64))
                Lis.append(Li.astype(np.float64))
            if G == 1:  # kvq_codebook_create: C = C^z L^-1 in double, rounded once
                c = (w[0].astype(np.float64) @ Lis[-1]).astype(np.float32) if qa else w[0]
                C.append(c)
                src = c[None]
            else:
                src = w
            m = float(np.abs(src).max())
            scale = 1.0
            while m / scale > F16_MAX and scale <= 2.0 ** 40:
                scale *= 2.0
            tabs.append((src * np.float32(1.0 / scale)).astype(np.float16).astype(np.float32))
            scales.append(scale)
            W.append(w.astype(np.float64))
        t = lambda x, dt: torch.tensor(np.stack(x), dtype=dt, device=dev)  # noqa: E731
        self.W = t(W, torch.float64)
        self.wnorm = (self.W ** 2).sum(-1)                       # [H, G, K]
        self.L: Any = t(Ls, torch.float64) if qa else None
        self.Linv: Any = t(Lis, torch.float64) if method == "qapq" else None
        self.C: Any = t(C, torch.float32) if G == 1 else None
        self.tab = t(tabs, torch.float32)
        self.tscale = torch.tensor(scales, dtype=torch.float64, device=dev)
        self.G, self.K = G, W[0].shape[1]
        self.centroid = G == 1 and method != "vq-postrope"        # resid.c centroid()


class TorchEngine:
    """An artifact's codebooks on a torch device, for a model (checked as
    kvq_engine_open checks it: shape, RoPE, fingerprint; MismatchError otherwise)."""

    def __init__(self, artifact: Union[str, Artifact], model: ModelSpec, device: Any = "cpu",
                 accept_model_mismatch: bool = False) -> None:
        import torch

        a = artifact if isinstance(artifact, Artifact) else Artifact(artifact)
        self.weights_note = a.check_model(model, accept_mismatch=accept_model_mismatch)
        self.method = method_of(a)
        _check_attention(a, model)
        d = model.head_dim
        if model.n_heads % model.n_kv_heads or d % 2:
            raise InvalidArgumentError(f"kvq torch back end: {model.n_heads} heads, {model.n_kv_heads} KV "
                                       f"heads, head_dim {d}", 500)
        self.model, self.device, self.artifact = model, torch.device(device), a
        self.window, self.wrope_b = a.wrope
        self.theta = rope_freqs(model)
        dev = self.device
        self.theta_t = torch.tensor(self.theta, dtype=torch.float64, device=dev)
        ang = self.wrope_b * self.theta
        self.bcos = torch.tensor(np.cos(ang).astype(np.float32), device=dev)
        self.bsin = torch.tensor(np.sin(ang).astype(np.float32), device=dev)
        pm, ps = a.metadata.get("positions.mode"), a.metadata.get("positions.score")
        if (pm or ps) and (pm not in POSITIONS or ps not in SCORES):
            raise UnsupportedError(f"{a.path}: positions.mode {pm!r} / positions.score {ps!r} is not a "
                                   f"position mode {POSITIONS} and a scoring query {SCORES}", 400)
        # kvq run / kvq eval take the artifact's recorded modes (kvq calibrate chose them)
        self.positions, self.score_pos = (pm, ps) if pm else ("wrope", "mean")
        self.layers: Dict[int, _Layer] = {}
        for l in a.layers:
            if 0 <= l < model.n_layers:
                self.layers[l] = _Layer(a, l, model.n_kv_heads, self.method, dev)

    def sequence(self, budget: Union[int, float, None] = 0.06, sink: Optional[int] = None, window: int = 0,
                 cache_f16: bool = True, positions: Optional[str] = None, score_pos: Optional[str] = None,
                 **_: Any) -> "TorchSequence":
        """A sequence (as kvq.Engine.sequence): budget a count or a fraction of the visible
        tokens, sink (default 4), window (0: the artifact's); positions "wrope" | "rope" and
        score_pos "rb" | "mean" | "bands" (kvq run's --positions / --score-pos; default: the
        artifact's recorded modes, else wrope and mean)."""
        if _.get("kv_cache"):
            raise UnsupportedError(f"kvq torch back end: kv_cache {_['kv_cache']!r}: the compressed KV caches "
                                   "(LeanKV, PATS) are the C engine's only", 400)
        if budget is None:
            budget = 0.06
        if (isinstance(budget, int) and not isinstance(budget, bool) and budget < 1) or \
                (isinstance(budget, float) and not 0 < budget <= 1):
            raise InvalidArgumentError(f"kvq torch back end: budget {budget!r}: a count >= 1 or a fraction "
                                       "in (0, 1]", 500)
        pm, ps = positions or self.positions, score_pos or self.score_pos
        if pm not in POSITIONS or ps not in SCORES:
            raise InvalidArgumentError(f"kvq torch back end: positions {pm!r} / score_pos {ps!r} "
                                       f"(positions {POSITIONS}, score_pos {SCORES})", 500)
        return TorchSequence(self, budget, 4 if sink is None else int(sink), window or self.window, cache_f16,
                             pm, ps)

    def close(self) -> None:
        pass


def _rotate(x: Any, cs: Any, sn: Any, interleaved: bool) -> Any:
    """Pairwise rotation of x [..., d] by (cs, sn) [..., d/2] (kvq_rk_rotate), in x's dtype."""
    import torch
    d = x.shape[-1]
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cs - x1 * sn, x0 * sn + x1 * cs], dim=-1).flatten(-2)
    x0, x1 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([x0 * cs - x1 * sn, x0 * sn + x1 * cs], dim=-1)


def _dots(a: Any, b: Any) -> Any:
    """a [H, m, d] . b [H, n, d] -> [H, m, n]: each dot in float64 (equal rows give
    bit-equal scores, so the ties of equal keys go to the earlier token as in the C
    engine), rounded to float32."""
    return (a.double() @ b.double().transpose(-1, -2)).float()


def _topk_earliest(scores: Any, k: int) -> Any:
    """Per row of scores [H, n], the indices of the k largest, equal scores to the earlier
    index, ascending: [H, k] (kvq_rk_topk). No sort: the k-th largest value (torch.topk),
    every score above it, then the earliest of those equal to it; the kept indices placed
    by their rank (a cumulative sum), so nothing is read back to the host."""
    import torch
    H, n = scores.shape
    if k >= n:
        return torch.arange(n, device=scores.device).expand(H, n)
    kth = torch.topk(scores, k, dim=-1, sorted=False).values.min(-1, keepdim=True).values
    gt = scores > kth
    eq = scores == kth
    need = k - gt.sum(-1, keepdim=True)
    keep = gt | (eq & (eq.cumsum(-1) <= need))
    slot = torch.where(keep, keep.cumsum(-1) - 1, k)                    # k: a spare column
    out = torch.zeros(H, k + 1, dtype=torch.long, device=scores.device)
    out.scatter_(1, slot, torch.arange(n, device=scores.device).expand(H, n))
    return out[:, :k]


def _pack(b: Any) -> Any:
    """Booleans [..., d] -> uint8 [..., ceil(d/8)]: channel c at byte c/8, bit c%8."""
    import torch
    d = b.shape[-1]
    nb = (d + 7) // 8
    x = torch.zeros(b.shape[:-1] + (nb * 8,), dtype=torch.uint8, device=b.device)
    x[..., :d] = b.to(torch.uint8)
    w = (2 ** torch.arange(8, device=b.device)).to(torch.uint8)
    return (x.view(b.shape[:-1] + (nb, 8)) * w).sum(-1, dtype=torch.uint8)


def _unpack(x: Any, d: int) -> Any:
    """uint8 [..., ceil(d/8)] -> +-1 float32 [..., d] (kvq_rt_resid_dequantize's signs)."""
    import torch
    w = (2 ** torch.arange(8, device=x.device)).to(torch.uint8)
    bits = (x[..., None] & w) != 0
    return torch.where(bits.flatten(-2)[..., :d], 1.0, -1.0).to(torch.float32)


def _sign_dots(q: Any, bits: Any) -> Any:
    """kvq_rk_sign_table and kvq_rk_resid_scores' sum: q [H, g, d] (d % 8 == 0), bits
    [H, n, d/8] -> [H, g, n] float32, q . (+-1)^d in the kernel's order (each byte's
    entry from two nibbles of four signed terms summed in order, the bytes summed in
    order from 0): the C engine's bits."""
    import torch
    H, g, d = q.shape
    v = torch.arange(16, device=q.device)
    m = torch.where(((v[:, None] >> torch.arange(4, device=q.device)) & 1) == 1, 1.0, -1.0)  # [16, 4]
    t = q.view(H, g, d // 4, 1, 4) * m                                  # [H, g, d/4, 16, 4]
    nib = ((t[..., 0] + t[..., 1]) + t[..., 2]) + t[..., 3]             # [H, g, d/4, 16]
    nib = nib.view(H, g, d // 8, 2, 16)
    tab = (nib[:, :, :, 0, :, None] + nib[:, :, :, 1, None, :]).transpose(-1, -2).reshape(H, g, d // 8, 256)
    idx = bits.long().transpose(1, 2)                                   # [H, d/8, n]
    x = torch.gather(tab, 3, idx[:, None].expand(H, g, d // 8, idx.shape[-1]))
    s = x[:, :, 0]
    for p in range(1, d // 8):
        s = s + x[:, :, p]
    return s


def _sum_rows(x: Any) -> Any:
    """x [..., g, d] summed over g in order, in x's dtype (kvq_rt_group_sum)."""
    s = x[..., 0, :]
    for g in range(1, x.shape[-2]):
        s = s + x[..., g, :]
    return s


class _Cache:
    """One layer's rows, grown by doubling (no per-step concatenation): k, v [cap, H, d]
    float32 (f16-rounded values), codes [cap, H, G] int64, bits [cap, H, ceil(d/8)] uint8
    (the residual's signs packed as resid.c packs them: channel c at byte c/8, bit c%8, 1
    for >= 0), scale [cap, H] float32, pos [cap] float64; n rows used; pos_host the
    positions as Python ints."""

    def __init__(self) -> None:
        self.n = 0
        self.pos_host: List[int] = []
        self.t: Dict[str, Any] = {}

    def add(self, rows: Dict[str, Any], pos: List[int]) -> None:
        import torch
        m = len(pos)
        for name, x in rows.items():
            buf = self.t.get(name)
            if buf is None or buf.shape[0] < self.n + m:
                cap = max(2 * (buf.shape[0] if buf is not None else 0), self.n + m, 64)
                nb = torch.empty((cap,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
                if buf is not None:
                    nb[:self.n] = buf[:self.n]
                self.t[name] = buf = nb
            buf[self.n:self.n + m] = x
        self.n += m
        self.pos_host += pos

    def __getitem__(self, name: str) -> Any:
        return self.t[name][:self.n]


def _band_edges(a: int, b: int) -> List[int]:
    """score_pos.c band_edges: band k is [E[k], E[k+1] - 1], E[0] = a, doubling, the last
    ending at b (E[nb] = b + 1)."""
    e = [a]
    while len(e) - 1 < 62:
        k = len(e) - 1
        nx = a << (k + 1) if k + 1 < 31 else int(round(a * 2.0 ** (k + 1)))
        nx = max(nx, e[k] + 1)
        if nx > b:
            break
        e.append(nx)
    return e + [b + 1]


class TorchSequence:
    """One sequence's cache and steps (the API of kvq.Sequence, torch tensors or numpy in;
    torch tensors out on the engine's device)."""

    def __init__(self, eng: TorchEngine, budget: Union[int, float], sink: int, window: int,
                 cache_f16: bool, positions: str = "wrope", score_pos: str = "mean") -> None:
        self.e, self.budget, self.sink, self.window, self.f16 = eng, budget, sink, window, cache_f16
        self.rope, self.score_pos = positions == "rope", score_pos
        self.cap = 0  # the C engine's scratch capacity (rows), kept over reset as it keeps it
        self._rot: Dict[Tuple[int, int], Tuple[Any, ...]] = {}
        self._steprot: Dict[Any, Tuple[Any, Any]] = {}
        self.reset()

    def reset(self) -> None:
        """Forgets the tokens."""
        self.c = [_Cache() for _ in range(self.e.model.n_layers)]

    def length(self, layer: int = 0) -> int:
        return self.c[layer].n

    def close(self) -> None:
        self.reset()

    def _tensor(self, x: Any) -> Any:
        import torch
        t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        return t.to(self.e.device, torch.float32)

    def _grow(self, T: int) -> None:
        """scratch_reserve (runtime/retrieval.c): the capacity after a call seeing T rows."""
        if T > self.cap:
            self.cap = T if T > 2 * self.cap else 2 * self.cap

    def _cs(self, pos: Any) -> Tuple[Any, Any]:
        """The RoPE table's rows (float32 cos, sin [.., d/2]) of positions pos (float64)."""
        import torch
        ang = pos[..., None] * self.e.theta_t
        return torch.cos(ang).float(), torch.sin(ang).float()

    def _step_cs(self, key: Any, pos: List[int]) -> Tuple[Any, Any]:
        """_cs of the positions pos (a list), kept while the step's layers ask for the same."""
        import torch
        hit = self._steprot.get(key)
        if hit is None:
            if len(self._steprot) > 8:
                self._steprot.clear()
            hit = self._steprot[key] = self._cs(torch.tensor(pos, dtype=torch.float64, device=self.e.device))
        return hit

    def _encode(self, lay: _Layer, k: Any, pos: Any, cs: Any, sn: Any) -> Tuple[Any, Any, Any]:
        """kvq_codebook_encode and kvq_rt_resid_append (1 bit) of rows k [m, H, d] (as the
        cache rounds them) at positions pos [m]: codes [m, H, G], packed signs [m, H, d/8], scales
        [m, H]; under ROPE the residual rotated by its position (cs, sn: [m, 1, d/2])."""
        import torch
        e = self.e
        m, H, d = k.shape
        il = e.model.rope_interleaved
        x = k.double().transpose(0, 1)                            # [H, m, d]
        if lay.L is not None:                                     # z = k L in double, rounded
            x = (x @ lay.L).float().double()
        elif e.method == "vq-postrope":                           # k R_p
            x = _rotate(k, cs, sn, il).transpose(0, 1).double()
        xg = x.view(H, m, lay.G, d // lay.G).transpose(1, 2)      # [H, G, m, dg]
        dist = (xg ** 2).sum(-1, keepdim=True) - 2 * xg @ lay.W.transpose(-1, -2) + lay.wnorm[:, :, None]
        codes = torch.argmin(dist, dim=-1).permute(2, 0, 1)       # [m, H, G]: the first minimum
        r = k - lay.C[torch.arange(H, device=k.device)[:, None], codes[..., 0].t()].transpose(0, 1) \
            if lay.centroid else k
        if self.rope:                                             # r' = R_p (k - c)
            r = _rotate(r, cs, sn, il)
        return codes, _pack(r >= 0), r.double().abs().mean(-1).float()

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
        c = self.c[layer]
        p = list(range(c.n, c.n + k.shape[0])) if pos is None else [int(x) for x in np.asarray(pos).ravel()]
        pt = torch.tensor(p, dtype=torch.float64, device=k.device)
        cs, sn = self._cs(pt[:, None])                            # [m, 1, d/2]
        round_ = (lambda x: x.half().float()) if self.f16 else (lambda x: x)  # noqa: E731
        kp = round_(k)  # the pre-RoPE key as a pre-RoPE cache holds it (kvq_rt_key_pre)
        # under ROPE the cache holds f16(k R_p): the f32 key rotated, then rounded (keys.c)
        rows = {"k": round_(_rotate(k, cs, sn, m.rope_interleaved)) if self.rope else kp,
                "v": round_(v), "pos": pt}
        self._grow(c.n + len(p))
        lay = self.e.layers.get(layer)
        if lay is not None:
            rows["codes"], rows["bits"], rows["scale"] = self._encode(lay, kp, pt, cs, sn)
        c.add(rows, p)

    def _bands(self, a: int, b: int) -> Tuple[Any, ...]:
        """The scoring rotations of candidates at distances [a, b] (kvq_rt_mean_rotation):
        (cos, sin [nb, d/2] float32, the bands' inner edges [nb - 1] float64); nb = 1
        (every distance) unless score_pos is bands. Kept for the step's layers."""
        import torch
        hit = self._rot.get((a, b))
        if hit is not None:
            return hit
        bands = self.score_pos == "bands"
        e = _band_edges(max(a, 1), b) if bands else [a, b + 1]
        t = self.e.theta
        cs, sn = [], []
        for lo, hi in zip(e[:-1], e[1:]):
            n, c = float(hi - lo), 0.5 * (lo + hi - 1)
            s2 = np.sin(0.5 * t)
            with np.errstate(divide="ignore", invalid="ignore"):
                damp = np.where(np.abs(s2) < 1e-12, 1.0, np.sin(0.5 * n * t) / (n * s2))
            cs.append((damp * np.cos(c * t)).astype(np.float32))
            sn.append((damp * np.sin(c * t)).astype(np.float32))
        dev = self.e.device
        hit = (torch.tensor(np.stack(cs), device=dev), torch.tensor(np.stack(sn), device=dev),
               torch.tensor(e[1:-1], dtype=torch.float64, device=dev))
        self._rot = {(a, b): hit}
        return hit

    def _lut(self, lay: _Layer, qs: Any) -> Any:
        """kvq_rk_lut of scoring queries qs [H, m, d]: [H, m, G, K] float32 (q' = qs L^-T in
        double for qapq, times the table's scale, rounded; dotted with the f16 table)."""
        qp = qs.double()
        if lay.Linv is not None:
            qp = qp @ lay.Linv.transpose(-1, -2)
        H, m, d = qs.shape
        qp = (qp * lay.tscale[:, None, None]).float().view(H, m, lay.G, d // lay.G)
        return (qp.transpose(1, 2) @ lay.tab.transpose(-1, -2)).transpose(1, 2)  # [H, m, G, K]

    def _first(self, lay: _Layer, q: Any, qb: Any, qi: Any, codes: Any, band: Any, a: int, b: int) -> Any:
        """The codebook's score of candidates (codes [H, n, G], their band [H, n] or None)
        for each query row of q [H, m, d] (pre-RoPE; qb, qi rotated): [H, m, n] float32, the
        groups' LUT entries summed in order (kvq_rk_score); the scoring query q R_b (rb), q
        R_i (vq-postrope) or q under the mean rotation of the candidates' distances (mean)
        or of the candidate's band (bands)."""
        import torch
        e = self.e
        H, m, d = q.shape
        if e.method == "vq-postrope" or self.score_pos == "rb":
            qs = (qi if e.method == "vq-postrope" else qb)[:, :, None]                # [H, m, 1, d]
        else:
            cs, sn, _ = self._bands(a, b)
            qs = _rotate(q[:, :, None], cs, sn, e.model.rope_interleaved)            # [H, m, nb, d]
        nb = qs.shape[2]
        lut = self._lut(lay, qs.reshape(H, m * nb, d)).view(H, m, nb, lay.G, lay.K)
        n = codes.shape[1]
        out = None
        for g in range(lay.G):
            idx = codes[..., g] if band is None or nb == 1 else band * lay.K + codes[..., g]
            x = torch.gather(lut[:, :, :, g].reshape(H, m, nb * lay.K), 2, idx[:, None].expand(H, m, n))
            out = x if out is None else out + x
        return out

    def _select(self, layer: int, q: Any, qb: Any, qi: Any, n: int, s_end: int, w_beg: int,
                i: int) -> Any:
        """The candidates every KV head keeps, token indices ascending [H, m]; q, qb, qi
        [H, gs, d] (pre-RoPE, q R_b, q R_i)."""
        import torch
        c, lay, e = self.c[layer], self.e.layers.get(layer), self.e
        nc = w_beg - s_end
        H, d = q.shape[0], q.shape[-1]
        kb = budget_tokens(self.budget, n)
        cand = torch.arange(s_end, w_beg, device=e.device).expand(H, nc)
        if lay is None or kb >= nc:  # layers without codebooks attend fully (select.c)
            return cand
        k2 = min(nc, kb + int(math.ceil(RERANK_EXTRA * nc)))
        k1 = k2
        if k2 < nc:  # kvq_rt_resid_count (1 bit: the share's cap is the candidates)
            want, cap = math.ceil(RESID_WIDE * k2), math.ceil(RESID_SHARE * nc)
            want = max(cap, k2) if want > cap else want
            k1 = nc if want >= nc else int(want)
        pos = c.pos_host
        a, b = i - pos[w_beg - 1], i - pos[s_end]
        a, b = min(a, b), max(a, b)
        bands = self.score_pos == "bands" and e.method != "vq-postrope"
        nb = len(_band_edges(max(a, 1), b)) - 1 if bands else 1
        codes, hidx = c["codes"], torch.arange(H, device=e.device)[:, None]

        def band_of(rows: Any) -> Any:
            return torch.bucketize(i - c["pos"][rows], self._bands(a, b)[2], right=True) if bands else None

        if k1 < nc:  # the first stage: the group's summed pre-RoPE query (codes.c)
            rows = cand
            first = self._first(lay, _sum_rows(q)[:, None], _sum_rows(qb)[:, None], _sum_rows(qi)[:, None],
                                codes[rows, hidx], band_of(rows), a, b)[:, 0]
            cand = cand.gather(1, _topk_earliest(first, k1))
        qr = qi if self.rope else qb  # the queries as the exact step scores keys
        if k1 > k2:  # the residual stage, by the best head (resid_group max)
            full = k1 == nc  # every candidate (the default): the rows as views, no gather
            take = (lambda t: t[s_end:w_beg].transpose(0, 1)) if full else (lambda t: t[cand, hidx])  # noqa: E731
            bits, sc_ = take(c["bits"]), take(c["scale"])                      # [H, m, d/8], [H, m]
            if lay.centroid and d % 8 == 0 and nb * lay.G * lay.K <= self.cap:  # fast_max_scores
                first = self._first(lay, q, qb, qi, take(codes), band_of(cand), a, b)  # [H, gs, m]
                sc = first + sc_[:, None] * _sign_dots(qr, bits)
            else:  # resid.c reconstruct: q_h . (c + a s), c rotated by its position under ROPE
                y = _unpack(bits, d) * sc_[..., None]
                if lay.centroid:
                    cc = lay.C[hidx, codes[cand, hidx][..., 0]]
                    if self.rope:
                        cc = _rotate(cc, *self._cs(c["pos"][cand]), e.model.rope_interleaved)
                    y = y + cc
                sc = _dots(qr, y)
            cand = cand.gather(1, _topk_earliest(sc.max(1).values, k2))
        if k2 > kb:  # the exact rerank: (sum q) . k, or the heads' summed logits from 4 on
            kk = c["k"][cand, hidx]                                             # [H, k2, d]
            if qr.shape[1] < 4:
                ex = _dots(_sum_rows(qr)[:, None], kk)[:, 0]
            else:
                ex = _sum_rows(_dots(qr, kk).transpose(1, 2)[..., None])[..., 0]
            cand = cand.gather(1, _topk_earliest(ex, kb))
        return cand

    def decode(self, layer: int, q: Any, k: Any, v: Any, pos: Optional[int] = None) -> Tuple[Any, List[Any]]:
        """One decode step (as kvq.Sequence.decode): appends k, v [n_kv_heads, head_dim] at
        pos, attends q [n_heads, head_dim] by retrieval. Returns (out [n_heads, head_dim],
        selected: per KV head the chosen candidate tokens, ascending; empty when every
        token was attended)."""
        import torch
        m, e = self.e.model, self.e
        q = self._tensor(q)
        if q.shape != (m.n_heads, m.head_dim):
            raise InvalidArgumentError(f"kvq torch back end: q has shape {tuple(q.shape)}, "
                                       f"expected {(m.n_heads, m.head_dim)}")
        c = self.c[layer]
        i = c.n if pos is None else int(pos)
        self.append(layer, self._tensor(k)[None], self._tensor(v)[None], [i])
        n, H, d = c.n, m.n_kv_heads, m.head_dim
        gs, dev, il = m.n_heads // H, e.device, m.rope_interleaved
        s_end = min(self.sink, n)
        w_beg = max(n - self.window, s_end)
        qg = q.view(H, gs, d)
        qb = _rotate(qg, e.bcos, e.bsin, il)
        qi = _rotate(qg, *self._step_cs(("q", i), [i]), il)
        if w_beg > s_end:
            sel = self._select(layer, qg, qb, qi, n, s_end, w_beg, i)
        else:
            sel = torch.zeros((H, 0), dtype=torch.long, device=dev)
        hidx = torch.arange(H, device=dev)[:, None]
        K, V = c["k"], c["v"]
        scl = 1.0 / math.sqrt(d)
        if self.rope:  # every attended token with exact RoPE: the cache holds k R_p
            att = torch.cat([torch.arange(0, s_end, device=dev).expand(H, s_end), sel,
                             torch.arange(w_beg, n, device=dev).expand(H, n - w_beg)], 1)
            p = torch.softmax((qi @ K[att, hidx].transpose(1, 2)) * scl, dim=2)
            out = (p @ V[att, hidx]).reshape(m.n_heads, d)
        else:
            # sinks outside the last `window` tokens are far (q R_b), the others near (exact RoPE)
            n_far_s = max(0, min(s_end, n - self.window))
            far = torch.cat([torch.arange(0, n_far_s, device=dev).expand(H, n_far_s), sel], 1)
            near = torch.cat([torch.arange(n_far_s, s_end, device=dev), torch.arange(w_beg, n, device=dev)])
            lf = (qb @ K[far, hidx].transpose(1, 2)) * scl                      # [H, gs, m_far]
            npos = c.pos_host[n_far_s:s_end] + c.pos_host[w_beg:n]
            kr = _rotate(K[near].transpose(0, 1), *self._step_cs(tuple(npos), npos), il)  # [H, m_near, d]
            ln = (qi @ kr.transpose(1, 2)) * scl
            p = torch.softmax(torch.cat([lf, ln], 2), dim=2)
            vv = torch.cat([V[far, hidx], V[near].transpose(0, 1)], 1)          # [H, m, d]
            out = (p @ vv).reshape(m.n_heads, d)
        return out, list(sel.unbind(0))
