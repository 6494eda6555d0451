#!/usr/bin/env python3
"""make_draft_model.py - a draft model for speculative decoding made from a
GGUF target by dropping transformer blocks: the blocks kept (renumbered),
the same embedding, final norm, output head and tokenizer (a layer-skip
draft). The result is a smaller, genuinely different model whose
vocabulary is the target's, so `--speculative-config '{"model": OUT,
...}'` accepts it; its proposals agree with the target's only in part.

Usage: make_draft_model.py TARGET.gguf OUT.gguf LAYERS [VOCAB_ROWS]
LAYERS: the blocks to keep, e.g. "0-7,26-29" (ranges and single indices).
VOCAB_ROWS (tests only): keep that many rows of the embedding and output,
a vocabulary other than the target's, which ferrum must refuse as a draft.
"""
import re
import sys

import gguf
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def parse_layers(spec, total):
    keep = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        keep += range(int(a), int(b or a) + 1)
    if not keep or sorted(set(keep)) != keep or keep[0] < 0 or keep[-1] >= total or len(keep) == total:
        sys.exit("LAYERS must name increasing blocks in [0, %d), fewer than all" % total)
    return keep


def copy_fields(reader, writer, arch, n_layers):
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        if name == "%s.block_count" % arch:
            writer.add_uint32(name, n_layers)
            continue
        sub = field.types[1] if vtype == GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    keep = parse_layers(sys.argv[3], int(reader.fields["%s.block_count" % arch].contents()))
    renumber = {old: new for new, old in enumerate(keep)}
    rows = int(sys.argv[4]) if len(sys.argv) == 5 else None
    writer = GGUFWriter(out, arch)
    copy_fields(reader, writer, arch, len(keep))
    for t in reader.tensors:
        name = t.name
        m = re.match(r"blk\.(\d+)\.(.*)", name)
        if m:
            if int(m.group(1)) not in renumber:
                continue
            name = "blk.%d.%s" % (renumber[int(m.group(1))], m.group(2))
        data = t.data[:rows] if rows and name in ("token_embd.weight", "output.weight") else t.data
        # quantized tensors come as rows of bytes, which the writer turns back into the element shape
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType(t.tensor_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
