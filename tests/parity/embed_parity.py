#!/usr/bin/env python3
"""GPU-machine parity of /v1/embeddings with sentence-transformers and
transformers (torch; no network).

Builds, with random weights (seeded) and a WordPiece tokenizer trained with
HF `tokenizers` on a few sentences:
  - a tiny BertModel (hidden_act gelu: the erf GELU) saved as
    sentence-transformers folders (Transformer + Pooling + Normalize), one
    with mean pooling and one with CLS pooling: ferrum reads the pooling from
    modules.json / 1_Pooling/config.json; the reference is
    SentenceTransformer.encode(normalize_embeddings=True) on the same texts;
  - a tiny Qwen3ForCausalLM (tied embeddings) saved as a folder: ferrum with
    --pooling mean and --pooling last against transformers' final hidden
    states (the base model's last_hidden_state, which has the final norm)
    mean-pooled / last-token-pooled and L2-normalized, on token-id inputs.
Every model is saved in float32. ferrum runs `ferrumctl serve --task
embed` on each device asked (cpu: cosine >= 0.9999 per input; cuda: BERT
is refused at load (CPU only), Qwen3 last and mean pooling run with bf16
activations: cosine >= 0.999).
Prints a table and exits non-zero on failure.

usage: embed_parity.py FERRUMCTL OUT_DIR [--devices cpu,cuda]
"""
import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXTS = ["The capital of France is Paris.", "hello world", "Caf\u00e9 r\u00e9sum\u00e9, na\u00efve!",
         "Mean pooling averages every token's final hidden state.", "\u4f60\u597d\u4e16\u754c and more words",
         "A longer sentence about the weather in spring, when the trees bloom and it rains often."]


def wordpiece(folder):
    tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.train_from_iterator(TEXTS * 4, trainers.WordPieceTrainer(vocab_size=500, special_tokens=SPECIALS,
                                                                show_progress=False))
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tk.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                   pad_token="[PAD]", mask_token="[MASK]")
    fast.save_pretrained(folder)
    return fast


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else 1.5 / p.shape[1] ** 0.5))
            elif "norm" in name.lower():
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def bert_folder(out, mode, seed):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st_models
    base = os.path.join(out, "bert-base")
    if not os.path.exists(os.path.join(base, "config.json")):
        tok = wordpiece(base)
        cfg = BertConfig(vocab_size=len(tok), hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                         intermediate_size=256, max_position_embeddings=256, hidden_act="gelu")
        model = BertModel(cfg, add_pooling_layer=False)
        randomize(model, seed)
        model.save_pretrained(base, safe_serialization=True)
    tr = st_models.Transformer(base)
    pool = st_models.Pooling(tr.get_word_embedding_dimension(), pooling_mode=mode)
    st = SentenceTransformer(modules=[tr, pool, st_models.Normalize()], device="cpu")
    folder = os.path.join(out, f"bert-st-{mode}")
    st.save(folder)
    ref = st.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    return folder, [r.tolist() for r in ref]


def qwen3_folder(out, seed):
    folder = os.path.join(out, "qwen3")
    tok = wordpiece(folder)
    cfg = Qwen3Config(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                      tie_word_embeddings=True, rms_norm_eps=1e-6)
    model = Qwen3ForCausalLM(cfg)
    randomize(model, seed)
    model.save_pretrained(folder, safe_serialization=True)
    model.eval()
    ids = [tok(t)["input_ids"] for t in TEXTS]
    refs = {"mean": [], "last": []}
    with torch.no_grad():
        for x in ids:
            h = model.model(torch.tensor([x])).last_hidden_state[0].float()
            for mode, v in (("mean", h.mean(0)), ("last", h[-1])):
                refs[mode].append(torch.nn.functional.normalize(v, dim=0).tolist())
    return folder, ids, refs


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


def serve_embed(ferrumctl, folder, device, inputs, extra=()):
    srv = LocalServer(ferrumctl, ["--model", folder, "--task", "embed", "--device", device, "--host", "127.0.0.1",
                                  "--served-model-name", "m", "--max-model-len", "256", *extra])
    try:
        st, body = srv.json("POST", "/v1/embeddings", {"model": "m", "input": inputs})
        if st != 200:
            raise AssertionError(f"HTTP {st}: {body}")
        return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])]
    finally:
        srv.stop()


def main():
    ferrumctl, out = sys.argv[1], os.path.abspath(sys.argv[2])
    devices = sys.argv[sys.argv.index("--devices") + 1].split(",") if "--devices" in sys.argv else ["cpu", "cuda"]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    cases = []  # (name, folder, inputs, refs, extra args, devices)
    for i, mode in enumerate(("mean", "cls")):
        folder, ref = bert_folder(out, mode, 11)
        cases.append((f"bert-{mode}", folder, TEXTS, ref, (), ["cpu"]))
    qfolder, ids, qrefs = qwen3_folder(out, 12)
    for mode in ("mean", "last"):
        cases.append((f"qwen3-{mode}", qfolder, ids, qrefs[mode], ("--pooling", mode), devices))
    ok, rows = True, []
    for name, folder, inputs, ref, extra, devs in cases:
        for dev in [d for d in devs if d in devices]:
            try:
                got = serve_embed(ferrumctl, folder, dev, inputs, extra)
                worst = min(cosine(a, b) for a, b in zip(got, ref))
                need = 0.9999 if dev == "cpu" else 0.999
                passed = len(got) == len(ref) and worst >= need
                rows.append((name, dev, f"{worst:.7f}", f">= {need}", "PASS" if passed else "FAIL"))
            except AssertionError as e:
                passed = False
                rows.append((name, dev, "-", str(e)[-200:], "FAIL"))
            ok &= passed
    if "cuda" in devices:  # the encoder is refused on CUDA with a clear error
        try:
            serve_embed(ferrumctl, cases[0][1], "cuda", TEXTS)
            rows.append(("bert-mean", "cuda", "-", "loaded on CUDA (expected a refusal)", "FAIL"))
            ok = False
        except AssertionError as e:
            refused = "CPU backend" in str(e)
            rows.append(("bert-mean", "cuda", "-", "refused at load" if refused else str(e)[-200:],
                         "PASS" if refused else "FAIL"))
            ok &= refused
    print(f"{'model':11} {'device':6} {'min cosine':>11}  need")
    for r in rows:
        print(f"{r[0]:11} {r[1]:6} {r[2]:>11}  {r[3]}  {r[4]}")
    with open(os.path.join(out, "embed_parity.json"), "w") as f:
        json.dump(rows, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
