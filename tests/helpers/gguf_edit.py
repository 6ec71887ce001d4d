#!/usr/bin/env python3
"""gguf_edit.py - a copy of a GGUF model with metadata changed, written by the `gguf`
package (independently of kvq), for tests of degenerate models (issue 30 items 10, 11).

  gguf_edit.py IN OUT [--drop-prefix P]... [--u32 KEY=N]... [--arch NAME]

--drop-prefix  leaves out every key starting with P (e.g. tokenizer. : no tokenizer)
--u32          sets KEY to an unsigned 32-bit value (e.g. llama.block_count=1)
--arch         general.architecture (may be empty)
"""
import sys

import gguf


def main(argv: list) -> int:
    src, dst = argv[1], argv[2]
    drop, u32, arch = [], {}, None
    i = 3
    while i < len(argv):
        flag, val = argv[i], argv[i + 1]
        if flag == "--drop-prefix":
            drop.append(val)
        elif flag == "--u32":
            k, _, v = val.partition("=")
            u32[k] = int(v)
        elif flag == "--arch":
            arch = val
        else:
            raise ValueError(f"unknown argument {flag}")
        i += 2
    r = gguf.GGUFReader(src)
    a = r.fields["general.architecture"].contents() if arch is None else arch
    w = gguf.GGUFWriter(dst, a)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in u32 or \
                any(k.startswith(p) for p in drop):
            continue
        vt = f.types[0]
        w.add_key_value(k, f.contents(), vt,
                        sub_type=f.types[1] if vt == gguf.GGUFValueType.ARRAY else None)
    if a == "":  # the writer leaves an empty architecture out: write the empty string
        w.add_key_value("general.architecture", "", gguf.GGUFValueType.STRING)
    for k, v in u32.items():
        w.add_key_value(k, v, gguf.GGUFValueType.UINT32)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
