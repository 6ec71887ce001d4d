#!/usr/bin/env python3
"""edit_artifact.py - writes a copy of a .kvq artifact with metadata keys removed or set,
re-encoded as the format says (docs/format.md: the header frame, then one checksummed
zstd frame of the safetensors payload), with the zstandard package: the way a damaged
or hand-edited artifact that is still readable is made for the tests.

  edit_artifact.py IN OUT [--drop KEY]... [--set KEY=VALUE]...
"""
import json
import struct
import sys

import zstandard


def edit(buf: bytes, drop: list, put: dict) -> bytes:
    frame_size = struct.unpack_from("<I", buf, 4)[0]
    header = bytearray(buf[:8 + frame_size])
    payload = zstandard.ZstdDecompressor().decompress(buf[8 + frame_size:])
    n = struct.unpack_from("<Q", payload, 0)[0]
    st = json.loads(payload[8:8 + n])
    meta = st.get("__metadata__", {})
    for k in drop:
        if k not in meta:
            raise KeyError(f"no metadata key {k}")
        del meta[k]
    meta.update(put)
    st["__metadata__"] = dict(sorted(meta.items()))
    h = json.dumps(st, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    new_payload = struct.pack("<Q", len(h)) + h + payload[8 + n:]
    struct.pack_into("<Q", header, 24, len(new_payload))
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True)
    return bytes(header) + cctx.compress(new_payload)


def main(argv: list) -> int:
    src, dst, drop, put = argv[1], argv[2], [], {}
    i = 3
    while i < len(argv):
        if argv[i] == "--drop":
            drop.append(argv[i + 1])
        elif argv[i] == "--set":
            k, _, v = argv[i + 1].partition("=")
            put[k] = v
        else:
            raise ValueError(f"unknown argument {argv[i]}")
        i += 2
    with open(src, "rb") as f:
        out = edit(f.read(), drop, put)
    with open(dst, "wb") as f:
        f.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
