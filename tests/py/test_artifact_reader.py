#!/usr/bin/env python3
"""test_artifact_reader.py - the C writer against the independent reader.

examples/write_artifact (public C API only) writes an artifact whose every value is
known in closed form; scripts/kvq_read.py, written from docs/format.md alone, must
read back exactly those tensors and metadata, `zstd -d` must give the same payload,
`kvq inspect --json` must list the same, and both readers must accept and refuse
the same damaged files. Exit 0 pass, 77 skip (reason on the last line), else fail.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

try:
    import numpy as np
    import zstandard  # noqa: F401  (kvq_read needs it)
except ImportError as e:
    print(f"needs numpy and zstandard ({e.name} missing; make deps installs them)")
    sys.exit(77)

import kvq_read  # noqa: E402

BUILD = os.environ.get("KVQ_BUILD", os.path.join(ROOT, "build"))
KVQ = os.environ.get("KVQ", os.path.join(BUILD, "kvq"))
WRITER = os.path.join(BUILD, "examples", "write_artifact")
DESCRIBE = os.path.join(BUILD, "examples", "describe_artifact")

EXPECTED_META = {
    "model.architecture": "llama", "model.n_layers": "2", "model.n_heads": "4",
    "model.n_kv_heads": "2", "model.head_dim": "4", "model.rope.base": "10000",
    "model.rope.layout": "interleaved", "model.rope.scaling": "none",
    "method": "qavq", "codebook_size": "4", "groups": "1", "wrope.w": "64",
    "wrope.b": "2048", "seed": "1234", "provenance.corpus_hash": "0123456789abcdef",
    "provenance.n_tokens": "4096", "provenance.tool_version": "kvq example",
    "provenance.backend": "cpu",
}


def expected_tensors():
    """The values examples/write_artifact.c documents, in closed form."""
    out = {}
    r = np.arange(4, dtype=np.float32)
    for l in range(2):
        for h in range(2):
            c = (np.float32(l) + np.float32(h) / 2 + r[:, None] / 4 + r[None, :] / 8)
            c = c.astype(np.float32)
            p = f"layer.{l}.head.{h}."
            out[p + "codebook"] = c
            out[p + "Cz"] = (2 * c).astype(np.float32)
            out[p + "L"] = (2 * np.eye(4)).astype(np.float32)
            out[p + "Linv"] = (0.5 * np.eye(4)).astype(np.float32)
    out["thresholds.leankv.alpha_h"] = np.array([[1, 1.5], [2, 2.5]], dtype=np.float32)
    out["thresholds.leankv.alpha_l"] = np.array(0.02, dtype=np.float32)
    return out


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def write(path, level=None):
    args = [WRITER, path] + ([str(level)] if level is not None else [])
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    with open(path, "rb") as f:
        return f.read()


def c_accepts(path):
    """Whether the C reader (through `kvq inspect`) opens the file."""
    r = subprocess.run([KVQ, "inspect", path], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    check(r.returncode in (0, 1), f"kvq inspect {path}: exit {r.returncode}: {r.stderr}")
    check(r.returncode == 0 or r.stderr.startswith(f"kvq inspect: {path}: "),
          f"kvq inspect error format: {r.stderr!r}")
    return r.returncode == 0


def py_kind(data):
    try:
        kvq_read.parse_artifact(data)
        return None
    except kvq_read.KvqFormatError as e:
        return e.kind


def main():
    if not os.access(WRITER, os.X_OK):
        print(f"{WRITER} is not built (make examples BUILD=...)")
        return 77
    tmp = tempfile.mkdtemp(prefix="kvq-py-")
    try:
        path = os.path.join(tmp, "example.kvq")
        raw = write(path)

        # The header frame, byte by byte, as docs/format.md section 2 lays it out.
        magic, fsize, tag, major, minor, flags, psize = struct.unpack_from("<II4sIIIQ", raw)
        check((magic, fsize, tag, major, minor, flags) ==
              (0x184D2A5B, 24, b"KVQA", 1, 1, 0), f"header {raw[:32].hex()}")
        check(raw[32:36] == b"\x28\xb5\x2f\xfd", "zstd frame does not start at byte 32")

        art = kvq_read.read_artifact(path)
        check((art.major, art.minor) == (1, 1), "version")
        check(len(art.payload) == psize, "payload size")
        check(art.metadata == EXPECTED_META, f"metadata {art.metadata}")
        want = expected_tensors()
        check(set(art.tensors) == set(want), f"tensor names {sorted(art.tensors)}")
        for name, value in want.items():
            got = art.tensors[name]
            check(art.dtypes[name] == "F32", f"{name} dtype {art.dtypes[name]}")
            check(got.shape == value.shape, f"{name} shape {got.shape}")
            check(np.array_equal(got, value), f"{name}: {got} != {value}")
            check(got.tobytes() == value.tobytes(), f"{name}: bytes differ")
        print(f"  read {len(art.tensors)} tensors, {len(art.metadata)} keys: all equal")

        # Same bytes twice; another level gives other bytes but the same payload.
        check(write(os.path.join(tmp, "again.kvq")) == raw, "two runs differ")
        fast = os.path.join(tmp, "fast.kvq")
        write(fast, 1)
        check(kvq_read.read_artifact(fast).payload == art.payload, "level 1 payload differs")

        # The standard tool opens it (it skips the header frame by itself).
        if shutil.which("zstd"):
            out = subprocess.run(["zstd", "-q", "-d", "-c", path], check=True,
                                 stdout=subprocess.PIPE).stdout
            check(out == art.payload, "zstd -d payload differs")
            print("  zstd -d: same payload")
        else:
            print("  zstd not installed: zstd -d check not run")

        # kvq inspect --json lists the same tensors and metadata.
        r = subprocess.run([KVQ, "inspect", "--json", path], check=True,
                           stdout=subprocess.PIPE, text=True)
        doc = json.loads(r.stdout)
        check(doc["metadata"] == art.metadata, "inspect metadata differs")
        check({t["name"]: (t["dtype"], t["shape"]) for t in doc["tensors"]} ==
              {n: (art.dtypes[n], list(t.shape)) for n, t in art.tensors.items()},
              "inspect tensors differ")
        check(doc["valid"] is True, f"inspect says invalid: {doc.get('problem')}")

        # The stable C API (examples/describe_artifact: kvq_artifact_describe_json and
        # kvq_artifact_codebook) gives what the independent reader reads.
        r = subprocess.run([DESCRIBE, path, "1", "1"], check=True, stdout=subprocess.PIPE,
                           text=True)
        first, *values = r.stdout.splitlines()
        doc = json.loads(first)
        check((doc["format"], doc["major"], doc["minor"], doc["payload_bytes"]) ==
              ("kvq", art.major, art.minor, psize), f"describe header {first[:120]}")
        check(doc["metadata"] == art.metadata and list(doc["metadata"]) == list(art.metadata),
              "describe metadata differs")
        check([(t["name"], t["dtype"], t["shape"], t["nbytes"]) for t in doc["tensors"]] ==
              [(n, art.dtypes[n], list(t.shape), t.nbytes) for n, t in art.tensors.items()],
              "describe tensors differ")
        cb = want["layer.1.head.1.codebook"]
        check(np.array_equal(np.array([float(v) for v in values], dtype=np.float32),
                             cb.reshape(-1)), "describe codebook values differ")
        print(f"  the stable C API: the same metadata, {len(doc['tensors'])} tensors, codebook")

        # Damage: both readers accept or refuse alike; the Python kinds are exact.
        def patched(off, fmt, value):
            b = bytearray(raw)
            struct.pack_into(fmt, b, off, value)
            return bytes(b)

        flipped = bytearray(raw)
        flipped[-1] ^= 0x40
        cases = [
            ("bad magic", patched(0, "<I", 0x184D2A50), "bad-magic"),
            ("bad tag", patched(8, "4s", b"KVQB"), "bad-magic"),
            ("major 2", patched(12, "<I", 2), "version"),
            ("minor 5", patched(16, "<I", 5), None),
            ("flags", patched(20, "<I", 1), "unsupported"),
            ("frame size 8", patched(4, "<I", 8), "corrupt"),
            ("payload size + 1", patched(24, "<Q", psize + 1), "corrupt"),
            ("payload size 2^35", patched(24, "<Q", 1 << 35), "corrupt"),
            ("payload size 2^63", patched(24, "<Q", 1 << 63), "too-large"),
            ("checksum", bytes(flipped), "checksum"),
            ("trailing byte", raw + b"\0", "corrupt"),
            ("second frame", raw + raw[32:], "corrupt"),
            ("header only", raw[:32], "truncated-data"),
            ("cut in header", raw[:20], "truncated-header"),
            ("cut in frame", raw[:len(raw) // 2], "truncated-data"),
            ("last byte missing", raw[:-1], "truncated-data"),
        ]
        for name, data, kind in cases:
            got = py_kind(data)
            check(got == kind, f"{name}: python reader says {got}, expected {kind}")
            f = os.path.join(tmp, "case.kvq")
            with open(f, "wb") as fh:
                fh.write(data)
            check(c_accepts(f) == (kind is None), f"{name}: C reader disagrees")
        for n in range(len(raw)):
            want_kind = "truncated-header" if n < 32 else "truncated-data"
            check(py_kind(raw[:n]) == want_kind, f"prefix {n}: {py_kind(raw[:n])}")
        print(f"  {len(cases)} damaged files and {len(raw)} prefixes: readers agree")

        # The command line of the reader.
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "kvq_read.py"),
                            path, "--json"], check=True, stdout=subprocess.PIPE, text=True)
        s = json.loads(r.stdout)
        check(s["version"] == "1.1" and s["metadata"] == EXPECTED_META, "kvq_read --json")
        check(s["tensors"]["layer.0.head.0.L"]["shape"] == [4, 4], "kvq_read --json shape")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
