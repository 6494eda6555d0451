#!/usr/bin/env python3
"""make_tiny_bert.py - writes a tiny BERT encoder with random weights
(seeded) and a WordPiece vocabulary trained on a few sentences:

  OUT/tiny-bert.gguf   GGUF arch bert, as llama.cpp's converter writes one
                       (tensor names, U+2581-spelled vocabulary, pooling_type
                       mean, [CLS] / [SEP] ids), F32 weights
  OUT/tiny-bert-hf/    the same weights as a transformers BertModel folder:
                       config.json (hidden_act gelu_new: the tanh GELU, as
                       llama.cpp computes it), model.safetensors,
                       tokenizer.json (BertNormalizer, BertPreTokenizer,
                       WordPiece, [CLS] $A [SEP]), and sentence-transformers'
                       modules.json + 1_Pooling/config.json (mean pooling:
                       without it ferrum pools a BERT by CLS)

usage: make_tiny_bert.py OUT_DIR [SEED]
Needs numpy, gguf and tokenizers (no torch).
"""
import json
import os
import struct
import sys

import numpy as np
import gguf
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

DIM, HEADS, FFN, LAYERS, MAX_POS, TYPES = 64, 4, 128, 2, 128, 2
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXT = ["The capital of France is Paris.", "Embeddings map sentences to vectors of numbers.",
        "A quick brown fox jumps over the lazy dog!", "hello world, hello again", "Caf\u00e9 r\u00e9sum\u00e9 na\u00efve",
        "Mean pooling averages every token's final hidden state.", "unbelievable, unaffable, unthinkable",
        "\u4f60\u597d\u4e16\u754c", "Numbers: 12345 and 3.14159", "The weather in spring is mild and rainy."]


def tokenizer():
    tk = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.train_from_iterator(TEXT, trainers.WordPieceTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                           show_progress=False))
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tk.decoder = decoders.WordPiece()
    return tk


def weights(rng, vocab):
    def mat(r, c):
        return (rng.standard_normal((r, c)) * 0.08).astype(np.float32)

    def vec(n, base=0.0, scale=0.05):
        return (base + rng.standard_normal(n) * scale).astype(np.float32)

    w = {"embeddings.word_embeddings.weight": mat(vocab, DIM) * 6,
         "embeddings.position_embeddings.weight": mat(MAX_POS, DIM) * 3,
         "embeddings.token_type_embeddings.weight": mat(TYPES, DIM) * 3,
         "embeddings.LayerNorm.weight": vec(DIM, 1.0, 0.1), "embeddings.LayerNorm.bias": vec(DIM)}
    for i in range(LAYERS):
        p = "encoder.layer.%d." % i
        for name, (r, c) in {"attention.self.query": (DIM, DIM), "attention.self.key": (DIM, DIM),
                             "attention.self.value": (DIM, DIM), "attention.output.dense": (DIM, DIM),
                             "intermediate.dense": (FFN, DIM), "output.dense": (DIM, FFN)}.items():
            w[p + name + ".weight"] = mat(r, c) * (3 if "self" in name else 1)
            w[p + name + ".bias"] = vec(r)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + name + ".weight"] = vec(DIM, 1.0, 0.1)
            w[p + name + ".bias"] = vec(DIM)
    return w


GGUF_NAMES = {"embeddings.word_embeddings.weight": "token_embd.weight",
              "embeddings.position_embeddings.weight": "position_embd.weight",
              "embeddings.token_type_embeddings.weight": "token_types.weight",
              "embeddings.LayerNorm.weight": "token_embd_norm.weight",
              "embeddings.LayerNorm.bias": "token_embd_norm.bias"}
GGUF_LAYER = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
              "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
              "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}


def gguf_name(hf):
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    parts = hf.split(".")
    layer, rest, suffix = parts[2], ".".join(parts[3:-1]), parts[-1]
    return "blk.%s.%s.%s" % (layer, GGUF_LAYER[rest], suffix)


def write_gguf(path, w, tk):
    vocab = sorted(tk.get_vocab().items(), key=lambda kv: kv[1])
    tokens = [t if t in SPECIALS else t[2:] if t.startswith("##") else "\u2581" + t for t, _ in vocab]
    g = gguf.GGUFWriter(path, "bert")
    g.add_name("tiny-bert")
    g.add_context_length(MAX_POS)
    g.add_embedding_length(DIM)
    g.add_feed_forward_length(FFN)
    g.add_block_count(LAYERS)
    g.add_head_count(HEADS)
    g.add_layer_norm_eps(1e-12)
    g.add_causal_attention(False)
    g.add_pooling_type(gguf.PoolingType.MEAN)
    g.add_token_type_count(TYPES)
    g.add_tokenizer_model("bert")
    g.add_token_list(tokens)
    g.add_token_types([3 if t in SPECIALS else 1 for t, _ in vocab])
    g.add_bos_token_id(2)
    g.add_sep_token_id(3)
    g.add_unk_token_id(1)
    g.add_pad_token_id(0)
    g.add_mask_token_id(4)
    for name, a in w.items():
        g.add_tensor(gguf_name(name), a)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def write_safetensors(path, w):
    header, off, blobs = {}, 0, []
    for name, a in w.items():
        b = np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_hf(folder, w, tk):
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    cfg = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": DIM, "num_hidden_layers": LAYERS,
           "num_attention_heads": HEADS, "intermediate_size": FFN, "hidden_act": "gelu_new",
           "max_position_embeddings": MAX_POS, "type_vocab_size": TYPES, "vocab_size": tk.get_vocab_size(),
           "layer_norm_eps": 1e-12, "pad_token_id": 0, "position_embedding_type": "absolute"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_safetensors(os.path.join(folder, "model.safetensors"), w)
    tk.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "modules.json"), "w") as f:
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
                  f, indent=1)
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": DIM, "pooling_mode_cls_token": False,
                   "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                   "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
                   "pooling_mode_lasttoken": False, "include_prompt": True}, f, indent=1)


def main():
    out = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    os.makedirs(out, exist_ok=True)
    tk = tokenizer()
    w = weights(np.random.default_rng(seed), tk.get_vocab_size())
    write_gguf(os.path.join(out, "tiny-bert.gguf"), w, tk)
    write_hf(os.path.join(out, "tiny-bert-hf"), w, tk)
    print("tiny BERT: vocab %d, dim %d, %d layers -> %s" % (tk.get_vocab_size(), DIM, LAYERS, out))


if __name__ == "__main__":
    main()
