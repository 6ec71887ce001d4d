"""Corpus specs as `kvq capture` reads them: the documents come from libkvq's corpus
reader (kvq/corpus.h: file:, dir:, jsonl:, ids:, uuid:, passkey:, kv-recall:, with the
same seed the same bytes), the packing into sequences is written here after
docs/capture.md ("Sequences") so that a tokenizer of your own (HF's) can be used."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence

import numpy as np

from . import _lib

FNV_INIT = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_M64 = 0xFFFFFFFFFFFFFFFF


class _CorpusParams(ctypes.Structure):
    _fields_ = [("seed", ctypes.c_uint64), ("uuid_lines", ctypes.c_uint32),
                ("passkey_filler", ctypes.c_uint32), ("kv_pairs", ctypes.c_uint32),
                ("max_doc_bytes", ctypes.c_size_t)]


class _Doc(ctypes.Structure):
    _fields_ = [("index", ctypes.c_uint64), ("source", ctypes.c_uint32), ("part", ctypes.c_uint32),
                ("label", ctypes.c_char_p), ("text", ctypes.c_void_p), ("len", ctypes.c_size_t),
                ("ids", ctypes.POINTER(ctypes.c_int32)), ("n_ids", ctypes.c_size_t),
                ("task", ctypes.c_int), ("answer", ctypes.c_char_p)]


def _declare(lib: ctypes.CDLL) -> None:
    if getattr(lib, "_kvq_corpus_declared", False):
        return  # the attribute is set below
    P, E = ctypes.c_void_p, ctypes.POINTER(_lib.KvqErr)
    lib.kvq_corpus_params_default.argtypes = [ctypes.POINTER(_CorpusParams)]
    lib.kvq_corpus_params_default.restype = None
    lib.kvq_corpus_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(_CorpusParams), ctypes.POINTER(P), E]
    lib.kvq_corpus_open.restype = ctypes.c_int
    lib.kvq_corpus_free.argtypes = [P]
    lib.kvq_corpus_free.restype = None
    lib.kvq_corpus_iter_new.argtypes = [P, ctypes.POINTER(P), E]
    lib.kvq_corpus_iter_new.restype = ctypes.c_int
    lib.kvq_corpus_iter_next.argtypes = [P, ctypes.POINTER(ctypes.POINTER(_Doc)), E]
    lib.kvq_corpus_iter_next.restype = ctypes.c_int
    lib.kvq_corpus_iter_free.argtypes = [P]
    lib.kvq_corpus_iter_free.restype = None
    setattr(lib, "_kvq_corpus_declared", True)


@dataclass
class Document:
    """One corpus document (or a part of a long file: part > 0 continues the text)."""

    index: int
    part: int
    label: str
    text: Optional[bytes]
    ids: Optional[np.ndarray]


def fnv1a64(data: bytes, h: int = FNV_INIT) -> int:
    """FNV-1a 64 over data, continuing from h."""
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _M64
    return h


def documents(spec: str, seed: int = 0) -> Iterator[Document]:
    """The documents of a corpus spec, in kvq's order (errors as KvqError)."""
    lib = _lib.lib()
    _declare(lib)
    p = _CorpusParams()
    lib.kvq_corpus_params_default(ctypes.byref(p))
    p.seed = int(seed)
    err = _lib.KvqErr()
    c, it = ctypes.c_void_p(), ctypes.c_void_p()
    _lib.check(lib.kvq_corpus_open(spec.encode(), ctypes.byref(p), ctypes.byref(c), ctypes.byref(err)), err)
    try:
        _lib.check(lib.kvq_corpus_iter_new(c, ctypes.byref(it), ctypes.byref(err)), err)
        while True:
            d = ctypes.POINTER(_Doc)()
            _lib.check(lib.kvq_corpus_iter_next(it, ctypes.byref(d), ctypes.byref(err)), err)
            if not d:
                return
            x = d.contents
            text = ctypes.string_at(x.text, x.len) if x.text else None
            ids = np.ctypeslib.as_array(x.ids, shape=(x.n_ids,)).copy() if x.ids and x.n_ids else \
                (None if text is not None else np.zeros(0, np.int32))
            yield Document(int(x.index), int(x.part), (x.label or b"").decode("utf-8", "replace"), text, ids)
    finally:
        lib.kvq_corpus_iter_free(it)
        lib.kvq_corpus_free(c)


@dataclass
class Packed:
    """Sequences cut from a corpus, with the provenance `kvq capture` records."""

    sequences: List[np.ndarray] = field(default_factory=list)
    hash: int = FNV_INIT
    n_docs: int = 0
    n_bytes: int = 0

    @property
    def hash_hex(self) -> str:
        return "%016x" % self.hash


def pack(docs: Iterator[Document], encode: Callable[[bytes, int], Sequence[int]], seq_len: int,
         max_tokens: int = 0, bos: Optional[int] = None, sep: Optional[int] = None,
         n_vocab: Optional[int] = None) -> Packed:
    """Cuts the documents' tokens into sequences as kvq_corpus_tokenize does for
    `kvq capture`: one packed stream, ``sep`` (or nothing) between documents, every
    sequence starting with ``bos`` when given, a separator never starting a sequence,
    the last shorter sequence kept (>= 2 tokens), stopping once ``max_tokens`` (0: no
    limit) were emitted. ``encode(text, part)`` tokenizes a text document (no special
    tokens). The hash covers the bytes of every document read."""
    if seq_len < 2:
        raise ValueError(f"seq_len {seq_len} is less than 2")
    out = Packed()
    buf: List[int] = []
    cap = seq_len
    head = 0
    has_doc = False
    emitted = 0
    done = False
    any_doc = False

    def emit() -> None:
        nonlocal buf, has_doc, emitted, done
        out.sequences.append(np.asarray(buf, dtype=np.int32))
        emitted += len(buf)
        buf, has_doc = [], False
        if max_tokens and emitted >= max_tokens:
            done = True

    def start() -> bool:
        nonlocal cap, head, has_doc, done
        cap = seq_len
        if max_tokens:
            left = max_tokens - emitted
            if left < cap:
                if left < 2:
                    done = True
                    return False
                cap = left
        buf.clear()
        if bos is not None:
            buf.append(bos)
        head = len(buf)
        has_doc = False
        return True

    def push(tok: int, is_doc: bool) -> None:
        nonlocal has_doc
        if done:
            return
        if not buf:
            if not is_doc or not start():
                return
        has_doc = has_doc or is_doc
        buf.append(tok)
        if len(buf) == cap:
            emit()

    for d in docs:
        if done:
            break
        out.n_docs += 1
        if d.text is not None:
            out.hash = fnv1a64(d.text, out.hash)
            out.n_bytes += len(d.text)
            toks = list(encode(d.text, d.part))
        else:
            ids = np.asarray(d.ids, dtype="<i4")
            out.hash = fnv1a64(ids.tobytes(), out.hash)
            out.n_bytes += 4 * len(ids)
            toks = ids.tolist()
            if n_vocab is not None and any(t < 0 or t >= n_vocab for t in toks):
                bad = next(t for t in toks if t < 0 or t >= n_vocab)
                raise ValueError(f"{d.label}: token id {bad} is outside the vocabulary of {n_vocab}")
        if not toks:
            continue
        if d.part == 0 and any_doc and sep is not None and len(buf) > head:
            push(sep, False)
        any_doc = True
        for t in toks:
            if done:
                break
            push(int(t), True)
    if not done and buf and has_doc and len(buf) >= 2:
        emit()
    return out
