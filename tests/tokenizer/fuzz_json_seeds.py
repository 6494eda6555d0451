#!/usr/bin/env python3
"""Writes small tokenizer.json files into OUT_DIR (argv[1]): seeds for
fuzz_tokenizer_json (tests/fuzz.sh). Real ones are megabytes, too big to
mutate; these keep the shapes the loader reads (byte-level BPE with a regex
Split, Digits and added tokens; SentencePiece-style BPE with byte fallback,
Prepend/Replace or Metaspace) and a tokenizer_config.json (specials, a chat
template).
Standard library only.
"""
import json
import os
import sys

# Llama 3's Split regex (model/tokenizer_json.c knows it by heart).
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """GPT-2's byte -> printable code point map (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bytelevel(split, digits):
    m = bytes_to_unicode()
    vocab = {m[b]: b for b in range(256)}
    merges = [["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"], ["\u0120", "t"], ["\u0120t", "h"]]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    pre = [{"type": "ByteLevel", "add_prefix_space": False, "use_regex": not split}]
    if split:
        pre.insert(0, {"type": "Split", "pattern": {"Regex": LLAMA3_RE},
                       "behavior": "Isolated", "invert": False})
    if digits:
        pre.insert(0, {"type": "Digits", "individual_digits": True})
    n = len(vocab)
    return {
        "added_tokens": [
            {"id": n, "content": "<|im_start|>", "special": True},
            {"id": n + 1, "content": "<|im_end|>", "special": True},
            {"id": n + 2, "content": "<user>", "special": False},
        ],
        "normalizer": None if split else {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre},
        "post_processor": {"type": "ByteLevel"},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges if split else [" ".join(p) for p in merges],
                  "ignore_merges": digits},
    }


def spm(metaspace):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for t in ["\u2581", "a", "\u2581a", "b", "ab", "\u2581ab"]:
        vocab[t] = len(vocab)
    if metaspace:
        norm = None
        pre = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    else:
        norm = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                     {"type": "Replace", "pattern": {"String": " "},
                                                      "content": "\u2581"}]}
        pre = None
    return {
        "added_tokens": [{"id": 1, "content": "<s>", "special": True}, {"id": 2, "content": "</s>", "special": True}],
        "normalizer": norm,
        "pre_tokenizer": pre,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}]},
        "model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>", "vocab": vocab,
                  "merges": ["\u2581 a", "a b", "\u2581a b"]},
    }


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {
        "bytelevel-split": bytelevel(True, False),
        "bytelevel-digits": bytelevel(False, True),
        "spm-prepend": spm(False),
        "spm-metaspace": spm(True),
        "tokenizer-config": {  # the target also reads its input as tokenizer_config.json
            "add_bos_token": True, "add_eos_token": False, "bos_token": "a",
            "eos_token": {"content": "b", "special": True}, "pad_token": None, "unk_token": "ab",
            "added_tokens_decoder": {"2": {"content": "ab", "special": True}},
            "chat_template": "{% for m in messages %}{{ bos_token + m['role'] + m['content'] }}{% endfor %}",
        },
    }
    for name, tok in seeds.items():
        with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
