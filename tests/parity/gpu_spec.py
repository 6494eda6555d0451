#!/usr/bin/env python3
"""Draft-model speculation on a GPU against plain decoding, greedy: the
target (Llama-3-8B shapes, dummy bf16) serves 6 token-id prompts without
speculation, then with itself as the draft (its own config: the same
random weights, so nearly every proposal is accepted and verified), then
with a Llama-3.2-1B-shaped dummy draft (nearly every proposal rejected).
A verify pass runs k + 1 rows through the prefill path where a decode step
runs the decode kernels, so their logits differ in the last bf16 bits and
random weights give near-ties: each output must equal the plain one, or
first differ at a token within the plain run's top 5 there (the rule the
GPU parity scripts use). usage: gpu_spec.py FERRUMCTL MODELS_DIR"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

ferrumctl, models = sys.argv[1:3]
target = os.path.join(models, "llama3-8b-dummy")
base = ["--model", target, "--load-format", "dummy", "--device", "cuda", "--max-model-len", "1024"]
prompts = [[(p * 7919 + i * 104729) % 49152 for i in range(16 + 8 * p)] for p in range(6)]


def run(extra):
    srv = LocalServer(ferrumctl, base + extra, ready_s=300)
    try:
        out = []
        for pr in prompts:
            st, r = srv.json("POST", "/v1/completions", {"prompt": pr, "max_tokens": 48, "temperature": 0,
                                                          "logprobs": 5, "return_tokens_as_token_ids": True})
            assert st == 200, r
            lp = r["choices"][0]["logprobs"]
            out.append((lp["tokens"], lp["top_logprobs"]))
        st, m = srv.request("GET", "/metrics")
        acc = {l.split("{")[0].split(":")[-1]: l.split()[-1] for l in m.decode().splitlines()
               if l.startswith("ferrum:spec_decode_num_") and "_per_pos" not in l}
        return out, acc
    finally:
        srv.stop()


def compare(name, plain, spec, acc):
    ok = True
    for i, ((pt, ptop), (st, _)) in enumerate(zip(plain, spec)):
        n = next((j for j in range(min(len(pt), len(st))) if pt[j] != st[j]), None)
        if n is None:
            verdict = "equal" if len(pt) == len(st) else "FAIL (lengths differ)"
        else:
            verdict = ("diverges at %d within the top 5" % n) if st[n] in ptop[n] else "FAIL at %d" % n
        ok &= not verdict.startswith("FAIL")
        print("  prompt %d: %s" % (i, verdict))
    print("%s %s (drafts %s, proposed %s, accepted %s)" % ("PASS" if ok else "FAIL", name,
          acc.get("spec_decode_num_drafts_total"), acc.get("spec_decode_num_draft_tokens_total"),
          acc.get("spec_decode_num_accepted_tokens_total")))
    return ok


def spec(draft):
    return ["--speculative-config", '{"model": "%s", "num_speculative_tokens": 4, "min_acceptance_rate": 0}' % draft]


plain, _ = run([])
ok = compare("draft = the target", plain, *run(spec(target)))
ok &= compare("draft = Llama-3.2-1B shapes", plain, *run(spec(os.path.join(models, "llama3-1b-dummy"))))
sys.exit(0 if ok else 1)
