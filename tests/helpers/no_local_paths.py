#!/usr/bin/env python3
"""no_local_paths.py FILE... — exit 1 when any metadata value of a .kvq artifact (read
with zstandard + the safetensors header, independently of kvq) or any string of a JSON
file (capture.json) holds an absolute path: a '/' at the start of the value or after a
space, ',', ':', '=', '+', '(' or a quote. Prints each offending key and value."""
import json
import re
import struct
import sys

import zstandard

ABS = re.compile(r"(^|[\s,:;=+(\"'])/[^/\s]")


def kvq_metadata(path):
    data = open(path, "rb").read()
    magic, size = struct.unpack_from("<II", data, 0)
    assert magic == 0x184D2A5B, path
    payload = zstandard.ZstdDecompressor().decompress(data[8 + size:])
    (n,) = struct.unpack_from("<Q", payload, 0)
    return json.loads(payload[8:8 + n]).get("__metadata__", {})


def strings(x, key=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from strings(v, key + "." + k if key else k)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from strings(v, "%s[%d]" % (key, i))
    elif isinstance(x, str):
        yield key, x


bad = 0
for f in sys.argv[1:]:
    items = kvq_metadata(f).items() if f.endswith(".kvq") else strings(json.load(open(f)))
    n = 0
    for k, v in items:
        n += 1
        if ABS.search(v):
            print("%s: %s = %r holds an absolute path" % (f, k, v))
            bad += 1
    print("%s: %d values checked" % (f, n))
sys.exit(1 if bad else 0)
