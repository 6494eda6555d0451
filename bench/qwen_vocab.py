#!/usr/bin/env python3
"""qwen_vocab.py - a tokenizer.json with Qwen's 151,643-token byte-level BPE
vocabulary (and its three chat special tokens), for benchmarks that need
a ~150k vocabulary (grammar_bench: the structured-output mask cost). The
tokens come from the qwen.tiktoken file that the `dashscope` package on
PyPI ships (base64 token bytes and rank per line); no merges are written
(the mask needs every token's bytes, not encoding).

  pip download --no-deps dashscope -d /tmp/ds && unzip -o /tmp/ds/*.whl -d /tmp/ds
  python bench/qwen_vocab.py /tmp/ds/dashscope/resources/qwen.tiktoken /tmp/qwen-tokenizer.json
"""
import base64
import json
import sys


def byte_to_unicode():
    """GPT-2's byte-level alphabet (what tokenizer.json vocabularies spell bytes with)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main(src, dst):
    alphabet = byte_to_unicode()
    vocab = {}
    with open(src, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            tok, rank = line.split()
            vocab["".join(alphabet[b] for b in base64.b64decode(tok))] = int(rank)
    n = len(vocab)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = [{"id": n + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, s in enumerate(specials)]
    doc = {"version": "1.0", "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                               "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                     "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}}
    with open(dst, "w") as f:
        json.dump(doc, f, ensure_ascii=False)
    print("%s: %d tokens + %d special" % (dst, n, len(specials)))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
