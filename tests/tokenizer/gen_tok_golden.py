#!/usr/bin/env python3
"""Tokenizer goldens from two outside references, llama.cpp and HF tokenizers.

usage: gen_tok_golden.py MODEL.gguf CORPUS.json OUT_DIR

From the real SmolLM2 GGUF it writes into OUT_DIR:
  - vocab-only GGUF variants of the same vocabulary with tokenizer.ggml.pre
    set to smollm (as shipped), gpt-2, llama-bpe and qwen2, and a synthetic
    SentencePiece ("llama") GGUF built from the decoded SmolLM2 pieces with
    scores and the 256 <0xXX> byte tokens;
  - tokenizer.json files for the four BPE variants, built with the HF
    `tokenizers` API from the GGUF vocab and merges with the pre-tokenizers
    the real models ship (SmolLM2: Digits(individual) + ByteLevel; GPT-2:
    ByteLevel; Llama 3 / Qwen2: Split(regex) + ByteLevel(use_regex=False));
  - WordPiece (BERT) tokenizers trained with the HF `tokenizers` API on
    every other corpus string (so the rest has unknown words): uncased
    (BertNormalizer's defaults: lowercase, accents stripped) and cased, as
    tokenizer.json, and the uncased one as a "bert" GGUF spelled as
    llama.cpp's converter spells it (U+2581 before word-initial pieces,
    continuations without "##"); both compared with HF's ids;
  - golden.json: for every corpus string and variant, the ids from
    llama.cpp (Llama(vocab_only=True).tokenize(add_bos=False, special=...))
    and from HF (encode(add_special_tokens=False), encode_special_tokens
    off/on), and whether each reference's decode gives the string back.
"""
import json
import os
import sys

import gguf
from gguf import GGUFReader, GGUFValueType, GGUFWriter
import llama_cpp
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from byte_level import unicode_to_bytes  # noqa: E402

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")

BPE_VARIANTS = {"smollm": "smollm", "gpt2": "gpt-2", "llama3": "llama-bpe", "qwen2": "qwen2"}


def field_value(f):
    return f.contents()


def read_gguf(path):
    r = GGUFReader(path)
    kv = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        kv[k] = (f.types, field_value(f))
    return kv


def write_gguf(path, kv, overrides):
    arch = kv["general.architecture"][1]
    w = GGUFWriter(path, arch)
    merged = dict(kv)
    merged.update(overrides)
    for k, (types, val) in merged.items():
        if k == "general.architecture":
            continue
        sub = types[1] if len(types) > 1 else None
        w.add_key_value(k, val, types[0], sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_tokenizer(tokens, types, merges, variant):
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=(variant == "llama3"))
    tk = Tokenizer(bpe)
    if variant == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif variant == "gpt2":
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        regex = LLAMA3_RE if variant == "llama3" else QWEN2_RE
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == 3]
    tk.add_special_tokens(special)
    return tk


def spm_gguf(kv, tokens, types, path):
    """A SentencePiece vocabulary from the decoded SmolLM2 pieces."""
    b2u = unicode_to_bytes()
    pieces, seen = [], set()
    for i, t in enumerate(tokens):
        if types[i] != 1:
            continue
        try:
            s = bytes(b2u[c] for c in t).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        if not s or any(ord(c) < 32 for c in s if c not in "\n\t"):
            continue
        s = s.replace(" ", "\u2581")
        if s in seen or (s.startswith("<0x") and len(s) == 6):
            continue
        seen.add(s)
        pieces.append(s)
        if len(pieces) >= 8000:
            break
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["<|user_tok|>"] + pieces
    ttypes = [2, 3, 3] + [6] * 256 + [4] + [1] * len(pieces)
    scores = [0.0] * (260) + [-float(i) for i in range(len(pieces))]
    keep = {k: v for k, v in kv.items() if not k.startswith("tokenizer.")}
    keep["llama.vocab_size"] = ([GGUFValueType.UINT32], len(toks))
    keep["tokenizer.ggml.model"] = ([GGUFValueType.STRING], "llama")
    keep["tokenizer.ggml.tokens"] = ([GGUFValueType.ARRAY, GGUFValueType.STRING], toks)
    keep["tokenizer.ggml.scores"] = ([GGUFValueType.ARRAY, GGUFValueType.FLOAT32], scores)
    keep["tokenizer.ggml.token_type"] = ([GGUFValueType.ARRAY, GGUFValueType.INT32], ttypes)
    keep["tokenizer.ggml.bos_token_id"] = ([GGUFValueType.UINT32], 1)
    keep["tokenizer.ggml.eos_token_id"] = ([GGUFValueType.UINT32], 2)
    keep["tokenizer.ggml.unknown_token_id"] = ([GGUFValueType.UINT32], 0)
    keep["tokenizer.ggml.add_bos_token"] = ([GGUFValueType.BOOL], True)
    write_gguf(path, keep, {})


def spm_json(gguf_path, path):
    """HF's Llama-style tokenizer.json for the synthetic SentencePiece vocab:
    BPE over U+2581 text with byte_fallback, merges derived from the piece
    scores the way transformers' SentencePieceExtractor does."""
    r = GGUFReader(gguf_path)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    scores = r.fields["tokenizer.ggml.scores"].contents()
    vocab = {t: i for i, t in enumerate(toks)}
    merges = []
    for piece, score in sorted(((t, scores[i]) for i, t in enumerate(toks) if types[i] == 1), key=lambda x: -x[1]):
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: -x[2])
    bpe = models.BPE(vocab=vocab, merges=[(a, b) for a, b, _ in merges], unk_token="<unk>", byte_fallback=True,
                     fuse_unk=True)
    tk = Tokenizer(bpe)
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tk.add_tokens([AddedToken("<|user_tok|>", special=False, normalized=False)])
    tk.save(path)


def broken_ggufs(kv, out):
    """Vocab-only GGUFs with wrong tokenizer arrays: the loader must refuse
    them with an error (name -> expected error name)."""
    S, A = GGUFValueType.STRING, GGUFValueType.ARRAY
    n = len(kv["tokenizer.ggml.tokens"][1])
    cases = {
        "tokens-int": ({"tokenizer.ggml.tokens": ([A, GGUFValueType.INT32], list(range(n)))}, "FR_EFORMAT"),
        "types-str": ({"tokenizer.ggml.token_type": ([A, S], ["x"] * n)}, "FR_EFORMAT"),
        "types-short": ({"tokenizer.ggml.token_type": ([A, GGUFValueType.INT32], [1] * (n - 1))}, "FR_EFORMAT"),
        "scores-short": ({"tokenizer.ggml.scores": ([A, GGUFValueType.FLOAT32], [0.0] * 3)}, "FR_EFORMAT"),
        "merges-int": ({"tokenizer.ggml.merges": ([A, GGUFValueType.INT32], [1, 2])}, "FR_EFORMAT"),
        "merges-nospace": ({"tokenizer.ggml.merges": ([A, S], ["ab"])}, "FR_EFORMAT"),
        "model-t5": ({"tokenizer.ggml.model": ([S], "t5")}, "FR_EUNSUPPORTED"),
        "model-int": ({"tokenizer.ggml.model": ([GGUFValueType.UINT32], 7)}, "FR_EFORMAT"),
        "tokens-scalar": ({"tokenizer.ggml.tokens": ([S], "a")}, "FR_EFORMAT"),
    }
    res = {}
    for name, (over, err) in cases.items():
        path = os.path.join(out, f"bad-{name}.gguf")
        write_gguf(path, kv, over)
        res[path] = err
    drop = dict(kv)
    del drop["tokenizer.ggml.merges"]
    path = os.path.join(out, "bad-no-merges.gguf")
    write_gguf(path, drop, {})
    res[path] = "FR_EFORMAT"
    return res


BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_EXTRA = ["The quick brown fox jumps over the lazy dog.", "Embeddings of sentences, pooled by their mean.",
              "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m", "\u4f60\u597d\u4e16\u754c", "unaffable"]


def bert_tokenizer(corpus, cased, max_chars=100):
    """A WordPiece tokenizer as BERT's, trained on every other corpus string."""
    tk = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=max_chars))
    tk.normalizer = normalizers.BertNormalizer(lowercase=not cased)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=3000, special_tokens=BERT_SPECIALS, show_progress=False)
    tk.train_from_iterator(corpus[::2] + BERT_EXTRA, trainer)
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tk.decoder = decoders.WordPiece()
    return tk


def bert_gguf(tk, path):
    """The tokenizer of tk as llama.cpp's converter writes a BERT vocabulary."""
    vocab = sorted(tk.get_vocab().items(), key=lambda kv: kv[1])
    tokens, types = [], []
    for t, _ in vocab:
        special = t in BERT_SPECIALS
        tokens.append(t if special else t[2:] if t.startswith("##") else "\u2581" + t)
        types.append(3 if special else 1)
    w = GGUFWriter(path, "bert")
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_uint32("tokenizer.ggml.cls_token_id", 2)
    w.add_sep_token_id(3)
    w.add_unk_token_id(1)
    w.add_pad_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_ids(path, corpus):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    res = {"special": [], "plain": [], "roundtrip": []}
    for s in corpus:
        b = s.encode("utf-8")
        res["special"].append(llm.tokenize(b, add_bos=False, special=True))
        ids = llm.tokenize(b, add_bos=False, special=False)
        res["plain"].append(ids)
        back = llm.detokenize(ids, special=True)
        res["roundtrip"].append(back == b or back == b" " + b)
    return res


def hf_ids(tk, corpus):
    res = {"special": [], "plain": [], "roundtrip": []}
    for flag, key in ((False, "special"), (True, "plain")):
        tk.encode_special_tokens = flag
        for s in corpus:
            res[key].append(tk.encode(s, add_special_tokens=False).ids)
    tk.encode_special_tokens = True
    for ids, s in zip(res["plain"], corpus):
        res["roundtrip"].append(tk.decode(ids, skip_special_tokens=False) == s)
    return res


def main():
    model, corpus_path, out = sys.argv[1:4]
    out = os.path.abspath(out)
    if not os.path.exists(model):
        print(f"skip: {model} not found; test_tokenizer will skip")
        golden = os.path.join(out, "golden.json")
        if os.path.exists(golden):
            os.remove(golden)
        return
    os.makedirs(out, exist_ok=True)
    with open(corpus_path, encoding="utf-8") as f:
        corpus = json.load(f)
    kv = read_gguf(model)
    tokens = kv["tokenizer.ggml.tokens"][1]
    types = kv["tokenizer.ggml.token_type"][1]
    merges = kv["tokenizer.ggml.merges"][1]
    golden = {"corpus": os.path.abspath(corpus_path), "variants": {}}
    for name, pre in BPE_VARIANTS.items():
        gpath = os.path.join(out, f"tok-{name}.gguf")
        write_gguf(gpath, kv, {"tokenizer.ggml.pre": ([GGUFValueType.STRING], pre)})
        tk = hf_tokenizer(tokens, types, merges, name)
        jpath = os.path.join(out, f"tok-{name}.tokenizer.json")
        tk.save(jpath)
        if name == "gpt2":  # the older "a b" spelling of merges
            with open(jpath, encoding="utf-8") as f:
                j = json.load(f)
            j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
            with open(jpath, "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False)
        golden["variants"][name] = {"gguf": gpath, "json": jpath, "llama": llama_ids(gpath, corpus),
                                    "hf": hf_ids(Tokenizer.from_file(jpath), corpus)}
    spath = os.path.join(out, "tok-spm.gguf")
    spm_gguf(kv, tokens, types, spath)
    golden["variants"]["spm"] = {"gguf": spath, "json": None, "llama": llama_ids(spath, corpus), "hf": None}
    sjson = os.path.join(out, "tok-spm.tokenizer.json")
    spm_json(spath, sjson)
    golden["variants"]["spm-json"] = {"gguf": None, "json": sjson, "llama": None,
                                      "hf": hf_ids(Tokenizer.from_file(sjson), corpus)}
    for name, cased in (("bert", False), ("bert-cased", True)):
        tk = bert_tokenizer(corpus, cased)
        jpath = os.path.join(out, f"tok-{name}.tokenizer.json")
        tk.save(jpath)
        gpath = None
        if not cased:
            gpath = os.path.join(out, f"tok-{name}.gguf")
            bert_gguf(tk, gpath)
        golden["variants"][name] = {"gguf": gpath, "json": jpath, "llama": None, "roundtrip": False,
                                    "hf": hf_ids(Tokenizer.from_file(jpath), corpus)}
    golden["broken"] = broken_ggufs(kv, out)
    with open(os.path.join(out, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False)
    for name, v in golden["variants"].items():
        agree = "-" if not v["hf"] or not v["llama"] else sum(a == b for a, b in zip(v["llama"]["special"], v["hf"]["special"]))
        print(f"{name}: {len(corpus)} strings, llama.cpp == HF on {agree}")


if __name__ == "__main__":
    main()
