#!/usr/bin/env python3
"""NaN logits on the GPU end one request, not its neighbours (device machine,
repo root, after `source .device/env.sh`): a tiny untied llama whose
embedding row 500 is NaN, served by `ferrumctl serve --device cuda`; a
completion whose prompt holds token 500 must end with an error, one beside
it without that token must finish normally, with the tokens it gets alone.
usage: gpu_nonfinite.py FERRUMCTL TOKENIZER_DIR OUT_DIR"""
import http.client, json, os, shutil, subprocess, sys, threading, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM

ferrumctl, tok_dir, out = sys.argv[1:4]
model = os.path.join(out, "tiny-nan")
cfg = LlamaConfig(vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
m = LlamaForCausalLM(cfg)
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    for n, p in m.named_parameters():
        p.copy_(torch.randn(p.shape, generator=g) * (1.0 if p.ndim == 1 or "embed" in n else p.shape[1] ** -0.5)
                + (1.0 if p.ndim == 1 else 0.0))
    m.model.embed_tokens.weight[500] = float("nan")
m.to(torch.bfloat16).save_pretrained(model, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(tok_dir, f), os.path.join(model, f))

port = 18650
log = open(os.path.join(out, "serve-nan.log"), "w")
srv = subprocess.Popen([ferrumctl, "serve", "--model", model, "--device", "cuda", "--port", str(port),
                        "--num-kv-blocks", "512", "--served-model-name", "nan"], stdout=log, stderr=log)

def post(prompt):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps({"model": "nan", "prompt": prompt, "max_tokens": 12,
                                                      "temperature": 0, "ignore_eos": True}),
              {"content-type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read())

status = 1
try:
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1); c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.5)
    clean, poisoned = [1, 504, 3458, 282, 4649, 314], [1, 9690, 500, 2683, 253]
    alone = post(clean)
    res = {}
    ts = [threading.Thread(target=lambda k, p: res.__setitem__(k, post(p)), args=(k, p))
          for k, p in (("clean", clean), ("poisoned", poisoned))]
    for t in ts: t.start()
    for t in ts: t.join()
    ok_alone = alone[0] == 200 and alone[1]["choices"][0]["finish_reason"] == "length"
    ok_clean = res["clean"][0] == 200 and res["clean"][1]["choices"][0]["text"] == alone[1]["choices"][0]["text"]
    ok_poison = res["poisoned"][0] >= 500 and "non-finite" in json.dumps(res["poisoned"][1])
    print(f"alone: {alone[0]} {alone[1]['choices'][0]['finish_reason'] if alone[0] == 200 else alone[1]}")
    print(f"beside the NaN request: {res['clean'][0]}, same text as alone: {ok_clean}")
    print(f"NaN request: {res['poisoned'][0]} {json.dumps(res['poisoned'][1])[:200]}")
    status = 0 if ok_alone and ok_clean and ok_poison else 1
    print("PASS" if status == 0 else "FAIL", " non-finite logits end one request on the GPU")
finally:
    srv.terminate(); srv.wait(timeout=60)
sys.exit(status)
