"""A small safetensors reader over bytes in memory (numpy only)."""
from __future__ import annotations

import json
import struct
from typing import Dict, List, Tuple

import numpy as np

from .errors import FormatError

_DTYPES = {
    "BOOL": "?", "U8": "u1", "I8": "i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
    "BF16": "<u2", "I32": "<i4", "U32": "<u4", "F32": "<f4", "I64": "<i8", "U64": "<u8",
    "F64": "<f8",
}


class SafeTensors:
    """Tensors and ``__metadata__`` of a safetensors buffer. ``tensor(name)`` returns a
    read-only numpy view (BF16 converted to float32)."""

    def __init__(self, data: bytes, label: str) -> None:
        self.label = label
        if len(data) < 8:
            raise FormatError(f"{label}: safetensors payload shorter than its 8-byte header size")
        (n,) = struct.unpack_from("<Q", data, 0)
        if n > len(data) - 8:
            raise FormatError(f"{label}: safetensors header of {n} bytes past the end")
        try:
            head = json.loads(bytes(data[8:8 + n]).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise FormatError(f"{label}: safetensors header does not parse: {e}") from None
        self.metadata: Dict[str, str] = dict(head.pop("__metadata__", None) or {})
        self._base = 8 + n
        self._data = memoryview(data)
        self._index: Dict[str, Tuple[str, List[int], int, int]] = {}
        for name, t in head.items():
            dt, shape, (a, b) = t["dtype"], list(t["shape"]), t["data_offsets"]
            if dt not in _DTYPES:
                raise FormatError(f"{label}: tensor {name}: dtype {dt} not readable here")
            if b > len(data) - self._base or a > b:
                raise FormatError(f"{label}: tensor {name}: data outside the payload")
            self._index[name] = (dt, shape, a, b)

    def names(self) -> List[str]:
        """Tensor names, in the order of their data."""
        return sorted(self._index, key=lambda k: self._index[k][2])

    def dtype(self, name: str) -> str:
        return self._index[name][0]

    def shape(self, name: str) -> List[int]:
        return list(self._index[name][1])

    def span(self, name: str) -> Tuple[int, int]:
        """(offset from the start of the data section, byte length)."""
        _, _, a, b = self._index[name]
        return a, b - a

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def tensor(self, name: str) -> np.ndarray:
        if name not in self._index:
            raise KeyError(f"{self.label}: no tensor {name}")
        dt, shape, a, b = self._index[name]
        x = np.frombuffer(self._data[self._base + a:self._base + b], dtype=_DTYPES[dt])
        if dt == "BF16":
            x = (x.astype(np.uint32) << 16).view(np.float32)
        return x.reshape(shape)
