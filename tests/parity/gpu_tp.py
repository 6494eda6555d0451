#!/usr/bin/env python3
"""Tensor parallelism on GPUs against transformers (device machine, 2+ GPUs).

Builds a small random llama and qwen3 (hf_parity.py's architectures, bf16
safetensors, vocabulary 49152 with SmolLM2's tokenizer copied in), runs
transformers greedy on cuda:0 in bf16 for 32 tokens from 4 token-id prompts
(top-5 at every step), then `ferrumctl serve --device cuda` at each
--tensor-parallel-size given (default 1 and 2) and compares each to
transformers with vLLM's rule: equal, or at the first divergence ferrum's
token is in transformers' top 5. Each size above 2 is also compared with
TP=2 (tokens equal before the first divergence, and the same rule with
transformers' top 5 at it). ferrum's logprobs name tokens by their text; they are
mapped back to ids through the tokenizer's byte-level vocabulary.

usage: gpu_tp.py FERRUMCTL TOKENIZER_DIR OUT_DIR [TP_SIZE ...]
Prints one line per (model, tp) and exits non-zero on a failure.
"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from byte_level import unicode_to_bytes  # noqa: E402
from hf_parity import configs, randomize  # noqa: E402

N_OUT = 32
PORT = 18700


def ids_by_text(tok_dir):
    """ferrum's token text (UTF-8, or "bytes:\\xNN..." when not UTF-8) -> id."""
    vocab = json.load(open(os.path.join(tok_dir, "tokenizer.json")))["model"]["vocab"]
    dec = unicode_to_bytes()
    out = {}
    for t, i in vocab.items():
        try:
            raw = bytes(dec[ch] for ch in t)
        except KeyError:
            raw = t.encode()
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError:
            key = "bytes:" + "".join("\\x%02x" % b for b in raw)
        out.setdefault(key, i)
    return out


def hf_greedy(model, ids):
    x = torch.tensor([ids], device="cuda:0")
    with torch.no_grad():
        out = model.generate(x, max_new_tokens=N_OUT, do_sample=False, num_beams=1, top_k=None, top_p=None,
                             temperature=None, pad_token_id=0, eos_token_id=None)
        full = model(out[:, :-1]).logits[0, len(ids) - 1:].float()
    return out[0, len(ids):].tolist(), full.topk(5, dim=-1).indices.tolist()


def request(body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, data[:500]))
    return json.loads(data)


def serve(ferrumctl, folder, tp, log):
    p = subprocess.Popen([ferrumctl, "serve", "--model", folder, "--device", "cuda", "--tensor-parallel-size",
                          str(tp), "--port", str(PORT), "--num-kv-blocks", "2048", "--max-num-seqs", "16"],
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        if p.poll() is not None:
            raise RuntimeError("serve exited %d" % p.returncode)
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=1)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p
        except OSError:
            pass
        time.sleep(0.2)
    p.kill()
    raise RuntimeError("serve not healthy")


def report(name, what, against, refs, got_all):
    """Prints how many greedy tokens of GOT_ALL equal REFS ((tokens, top5)
    per prompt) before the first divergence; True when each divergence is
    in the top 5 there."""
    agreed, fails = 0, []
    for k, ((ref, top5), got) in enumerate(zip(refs, got_all)):
        div = next((t for t in range(N_OUT) if got[t] != ref[t]), None)
        agreed += N_OUT if div is None else div
        if div is not None and got[div] not in top5[div]:
            fails.append("prompt %d: at %d %d not in HF top-5 %s" % (k, div, got[div], top5[div]))
    print("%-6s %s: %d of %d greedy tokens equal to %s before any divergence; %s" %
          (name, what, agreed, N_OUT * len(refs), against, "PASS" if not fails else "FAIL " + "; ".join(fails)))
    sys.stdout.flush()
    return not fails


def main():
    ferrumctl, tok_dir, out = sys.argv[1:4]
    sizes = [int(a) for a in sys.argv[4:]] or [1, 2]
    os.makedirs(out, exist_ok=True)
    to_id = ids_by_text(tok_dir)
    ok = True
    for i, (name, (cls, cfg)) in enumerate(configs().items()):
        if name not in ("llama", "qwen3"):
            continue
        cfg.vocab_size = 49152
        model = cls(cfg)
        randomize(model, 200 + i)
        folder = os.path.join(out, "tp-" + name)
        model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok_dir, f), folder)
        model = cls.from_pretrained(folder, torch_dtype=torch.bfloat16).to("cuda:0").eval()
        g = torch.Generator().manual_seed(11 + i)
        prompts = [torch.randint(0, cfg.vocab_size, (16 + 8 * k,), generator=g).tolist() for k in range(4)]
        refs = [hf_greedy(model, p) for p in prompts]
        del model
        torch.cuda.empty_cache()
        by_tp = {}
        for tp in sizes:
            with open(os.path.join(out, "serve-%s-tp%d.log" % (name, tp)), "w") as log:
                srv = serve(ferrumctl, folder, tp, log)
                try:
                    res = [request({"prompt": p, "max_tokens": N_OUT, "temperature": 0, "logprobs": 1,
                                    "ignore_eos": True})["choices"][0]["logprobs"]["tokens"] for p in prompts]
                finally:
                    srv.send_signal(signal.SIGTERM)
                    srv.wait(60)
            by_tp[tp] = [[to_id.get(t, -1) for t in toks] for toks in res]
            ok &= report(name, "tp=%d" % tp, "transformers bf16", refs, by_tp[tp])
            if tp > 2 and 2 in by_tp:
                ok &= report(name, "tp=%d" % tp, "tp=2", [(r, top5) for r, (_, top5) in zip(by_tp[2], refs)], by_tp[tp])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
