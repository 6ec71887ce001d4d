#!/usr/bin/env python3
"""kvq_read.py - an independent reader for .kvq artifacts (docs/format.md).

Written from the specification alone, with no code shared with libkvq, so that the
tests can check that what the C writer produces is what the document says.

    python3 scripts/kvq_read.py FILE [--json]

As a module:

    art = read_artifact("model.kvq")
    art.major, art.minor            # format version
    art.metadata                    # dict str -> str (safetensors __metadata__)
    art.tensors["layer.0.head.0.codebook"]   # numpy array, shape as stored
    art.payload                     # the decompressed safetensors bytes

Every problem raises KvqFormatError with .kind set to one of: "truncated-header",
"bad-magic", "version", "unsupported", "too-large", "truncated-data", "checksum",
"corrupt", "safetensors". Needs numpy and the `zstandard` module.
"""
import hashlib
import json
import struct
import sys

import numpy as np
import zstandard

SKIPPABLE_MAGIC = 0x184D2A5B
TAG = b"KVQA"
MAJOR = 1
MAX_PAYLOAD = 64 << 30
ZSTD_MAGIC = 0xFD2FB528
HEADER_FIELDS = 24  # tag, major, minor, flags, payload size

# safetensors dtype -> numpy dtype (little-endian). BF16 and F8 are returned as raw
# integers of the same width (numpy has no such types); see to_float32().
DTYPES = {
    "BOOL": np.dtype("?"), "U8": np.dtype("u1"), "I8": np.dtype("i1"),
    "F8_E4M3": np.dtype("u1"), "F8_E5M2": np.dtype("u1"),
    "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"), "I32": np.dtype("<i4"), "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"), "I64": np.dtype("<i8"), "U64": np.dtype("<u8"),
    "F64": np.dtype("<f8"),
}


class KvqFormatError(Exception):
    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class Artifact:
    def __init__(self, major, minor, payload, tensors, dtypes, metadata):
        self.major = major
        self.minor = minor
        self.payload = payload
        self.tensors = tensors      # name -> np.ndarray
        self.dtypes = dtypes        # name -> safetensors dtype name
        self.metadata = metadata    # key -> str


def to_float32(array, dtype_name):
    """A tensor as float32 values (BF16 widened; F16/F32/F64 converted)."""
    if dtype_name == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


# ---- the zstd frame ----------------------------------------------------------------

def zstd_frame_size(buf):
    """Length of the single zstd frame at the start of buf, walking its block headers
    (RFC 8878, section 3.1.1). Raises KvqFormatError if buf ends inside it. Returns
    (frame size, has checksum, content size or None)."""
    if len(buf) < 4:
        raise KvqFormatError("truncated-data", "file ends before the compressed payload")
    (magic,) = struct.unpack_from("<I", buf, 0)
    if magic != ZSTD_MAGIC:
        raise KvqFormatError("corrupt", f"no zstd frame after the header (magic {magic:08x})")
    if len(buf) < 5:
        raise KvqFormatError("truncated-data", "file ends inside the zstd frame header")
    fhd = buf[4]
    fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
    if fhd & 0x08:
        raise KvqFormatError("corrupt", "zstd frame header reserved bit set")
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    fcs_size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if len(buf) < pos + fcs_size:
        raise KvqFormatError("truncated-data", "file ends inside the zstd frame header")
    content_size = None
    if fcs_size:
        content_size = int.from_bytes(buf[pos:pos + fcs_size], "little")
        if fcs_size == 2:
            content_size += 256
    pos += fcs_size
    while True:
        if len(buf) < pos + 3:
            raise KvqFormatError("truncated-data", "file ends inside the compressed payload")
        header = int.from_bytes(buf[pos:pos + 3], "little")
        last, btype, bsize = header & 1, (header >> 1) & 3, header >> 3
        if btype == 3:
            raise KvqFormatError("corrupt", "reserved zstd block type")
        pos += 3 + (1 if btype == 1 else bsize)
        if len(buf) < pos:
            raise KvqFormatError("truncated-data", "file ends inside the compressed payload")
        if last:
            break
    if checksum:
        pos += 4
        if len(buf) < pos:
            raise KvqFormatError("truncated-data", "file ends inside the content checksum")
    return pos, bool(checksum), content_size


# ---- safetensors -------------------------------------------------------------------

def parse_safetensors(data):
    """(tensors, dtypes, metadata) from safetensors bytes, checking the layout."""
    def bad(msg):
        raise KvqFormatError("safetensors", msg)

    if len(data) < 8:
        bad("payload shorter than 8 bytes")
    (n,) = struct.unpack_from("<Q", data, 0)
    if n > len(data) - 8:
        bad(f"header length {n} runs past the payload")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        bad(f"header is not UTF-8 JSON: {e}")
    if not isinstance(header, dict):
        bad("header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        bad("__metadata__ must map strings to strings")
    body = data[8 + n:]
    tensors, dtypes, spans = {}, {}, []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            bad(f"tensor {name!r}: entry must have dtype, shape, data_offsets")
        dt = DTYPES.get(info["dtype"])
        if dt is None:
            bad(f"tensor {name!r}: unknown dtype {info['dtype']!r}")
        shape = info["shape"]
        begin, end = info["data_offsets"]
        if not all(isinstance(x, int) and x >= 0 for x in list(shape) + [begin, end]):
            bad(f"tensor {name!r}: shape and offsets must be non-negative integers")
        count = int(np.prod(shape, dtype=object)) if shape else 1
        if begin > end or end - begin != count * dt.itemsize:
            bad(f"tensor {name!r}: {end - begin} bytes for shape {shape} of {info['dtype']}")
        if end > len(body):
            bad(f"tensor {name!r} ends past the data section")
        spans.append((begin, end, name))
        tensors[name] = np.frombuffer(body, dtype=dt, count=count, offset=begin).reshape(shape)
        dtypes[name] = info["dtype"]
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            bad(f"tensor {name!r} starts at {begin}, expected {at} (gap or overlap)")
        at = end
    if at != len(body):
        bad(f"{len(body) - at} bytes after the last tensor")
    return tensors, dtypes, metadata


# ---- the artifact --------------------------------------------------------------------

def parse_artifact(buf):
    """Checks and decodes artifact bytes; returns an Artifact."""
    buf = bytes(buf)
    magic = struct.pack("<I", SKIPPABLE_MAGIC)
    if len(buf) < 4:
        if buf != magic[:len(buf)]:
            raise KvqFormatError("bad-magic", "not a .kvq artifact")
        raise KvqFormatError("truncated-header", "file ends inside the header")
    if buf[:4] != magic:
        raise KvqFormatError("bad-magic", f"not a .kvq artifact (magic {buf[:4].hex()})")
    tag = buf[8:12]
    if tag != TAG[:len(tag)]:
        raise KvqFormatError("bad-magic", "skippable frame is not a kvq header")
    if len(buf) < 20:
        raise KvqFormatError("truncated-header", "file ends inside the header")
    frame_size, = struct.unpack_from("<I", buf, 4)
    major, minor = struct.unpack_from("<II", buf, 12)
    if major != MAJOR:
        raise KvqFormatError("version", f"format version {major}.{minor} is not supported")
    if frame_size < HEADER_FIELDS:
        raise KvqFormatError("corrupt", f"header frame size {frame_size} is below 24")
    if len(buf) < 8 + frame_size:
        raise KvqFormatError("truncated-header", "file ends inside the header")
    flags, payload_size = struct.unpack_from("<IQ", buf, 20)
    if flags != 0:
        raise KvqFormatError("unsupported", f"header flags {flags:#x}")
    if payload_size > MAX_PAYLOAD:
        raise KvqFormatError("too-large", f"payload size {payload_size}")
    frame = buf[8 + frame_size:]
    size, has_checksum, content_size = zstd_frame_size(frame)
    if size != len(frame):
        raise KvqFormatError("corrupt", f"{len(frame) - size} bytes after the compressed payload")
    if not has_checksum:
        raise KvqFormatError("corrupt", "compressed payload has no content checksum")
    if content_size is None:
        raise KvqFormatError("corrupt", "compressed payload does not record its size")
    if content_size != payload_size:
        raise KvqFormatError("corrupt", f"header payload size {payload_size} != frame "
                             f"content size {content_size}")
    try:
        payload = zstandard.ZstdDecompressor().decompress(frame, max_output_size=payload_size)
    except zstandard.ZstdError as e:
        kind = "checksum" if "checksum" in str(e).lower() else "corrupt"
        raise KvqFormatError(kind, f"compressed payload: {e}") from None
    if len(payload) != payload_size:
        raise KvqFormatError("corrupt", f"payload is {len(payload)} bytes, header says "
                             f"{payload_size}")
    tensors, dtypes, metadata = parse_safetensors(payload)
    return Artifact(major, minor, payload, tensors, dtypes, metadata)


def read_artifact(path):
    with open(path, "rb") as f:
        return parse_artifact(f.read())


def summary(art):
    """A JSON-able description: version, metadata, and per tensor dtype, shape and
    the sha256 of its bytes."""
    return {
        "version": f"{art.major}.{art.minor}",
        "payload_size": len(art.payload),
        "metadata": art.metadata,
        "tensors": {
            name: {"dtype": art.dtypes[name], "shape": list(t.shape),
                   "sha256": hashlib.sha256(t.tobytes()).hexdigest()}
            for name, t in art.tensors.items()
        },
    }


def main(argv):
    args = [a for a in argv[1:] if a != "--json"]
    if len(args) != 1:
        print("usage: kvq_read.py FILE [--json]", file=sys.stderr)
        return 2
    try:
        art = read_artifact(args[0])
    except (OSError, KvqFormatError) as e:
        print(f"kvq_read: {args[0]}: {e}", file=sys.stderr)
        return 1
    if "--json" in argv:
        json.dump(summary(art), sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    print(f"kvq artifact version {art.major}.{art.minor}, payload {len(art.payload)} bytes")
    print(f"metadata ({len(art.metadata)}):")
    for k in sorted(art.metadata):
        print(f"  {k} = {art.metadata[k]}")
    print(f"tensors ({len(art.tensors)}):")
    for name, t in art.tensors.items():
        print(f"  {name} {art.dtypes[name]} {list(t.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
