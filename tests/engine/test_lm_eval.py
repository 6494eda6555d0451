#!/usr/bin/env python3
"""test_lm_eval.py - lm-evaluation-harness (its `local-completions` model,
with the server's own tokenizer through /tokenizer_info, /tokenize and
/detokenize) against `ferrumctl serve` with the real model, on two small
tasks built from local files (tests/engine/lm_eval/, no download):
- ferrum_choice, log-likelihood (multiple choice: each choice is one
  echo + logprobs request with max_tokens 1), scored by acc;
- ferrum_qa, generation (greedy to the first newline), scored by
  exact_match;
compared with the same requests answered by llama.cpp on the same GGUF
(llama-cpp-python called directly: log-likelihoods from its logits of
every position, greedy completions of the same token prompts):
- each request's log-likelihood within LL_TOL nats (a sum over the
  continuation's tokens; ferrum's and llama.cpp's per-token logprobs
  differ by ~0.06 nats on average), the same is_greedy where the margin
  is wide, acc within ACC_TOL (a near tie between choices may flip);
- exact_match within EM_TOL, and the same generated text for most docs
  (greedy decoding can part where two tokens nearly tie).

About 80 s of CPU on 2 cores (harness and server ~40 s, the llama.cpp
reference the rest). Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_lm_eval.py
Exit 77 (skip) when lm_eval, llama_cpp or the model is missing.
"""
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from local_serve import LocalServer  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "smol"
LL_TOL = 0.6     # nats, per request (a sum over 1-4 tokens)
ACC_TOL = 1 / 12 + 1e-9  # one of the 12 docs
EM_TOL = 2 / 8 + 1e-9    # two of the 8 docs (measured: one differs, 0.75 vs 0.625)
TASKS = {"ferrum_choice": "choice.jsonl", "ferrum_qa": "qa.jsonl"}


def write_tasks(folder):
    """The task YAMLs with the data files' absolute paths."""
    for task, data in TASKS.items():
        with open(os.path.join(HERE, "lm_eval", task + ".yaml.in")) as f:
            text = f.read().replace("@DATA@", os.path.join(HERE, "lm_eval", data))
        with open(os.path.join(folder, task + ".yaml"), "w") as f:
            f.write(text)


def run_harness(srv, folder):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    args = ("base_url=http://127.0.0.1:%d/v1/completions,model=%s,tokenizer_backend=remote,tokenized_requests=True,"
            "num_concurrent=1,max_retries=1,max_length=512,timeout=120" % (srv.port, NAME))
    return simple_evaluate(model="local-completions", model_args=args, tasks=list(TASKS),
                           task_manager=TaskManager(include_path=folder), log_samples=True, batch_size=1,
                           random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)


class Llama:
    """llama.cpp on the same file, asked what the harness asked ferrum."""

    def __init__(self):
        from llama_cpp import Llama as L
        self.llm = L(model_path=MODEL, n_ctx=512, logits_all=True, verbose=False, n_threads=2)

    def tok(self, s):
        return self.llm.tokenize(s.encode(), add_bos=False, special=False)

    def loglikelihood(self, context, continuation):
        """lm-eval's split of a pair (trailing spaces of the context go to the
        continuation; the continuation's tokens are the whole's after the
        context's), then the sum of the continuation's logprobs and whether
        each was the argmax."""
        import numpy as np
        n_sp = len(context) - len(context.rstrip())
        if n_sp:
            continuation, context = context[-n_sp:] + continuation, context[:-n_sp]
        whole, ctx = self.tok(context + continuation), self.tok(context)
        self.llm.reset()
        self.llm.eval(whole)
        sc = np.array(self.llm.scores[:len(whole)], dtype=np.float64)
        total, greedy = 0.0, True
        for i in range(len(ctx), len(whole)):
            row = sc[i - 1]
            mx = row.max()
            total += row[whole[i]] - mx - np.log(np.exp(row - mx).sum())
            greedy &= int(row.argmax()) == whole[i]
        return total, greedy

    def generate(self, context, until, max_toks):
        r = self.llm.create_completion(self.tok(context), max_tokens=max_toks, temperature=0, stop=until)
        return r["choices"][0]["text"]


class LmEval(unittest.TestCase):
    def test_against_llama_cpp(self):
        from lm_eval.api.metrics import exact_match_hf_evaluate
        with tempfile.TemporaryDirectory(prefix="ferrum-lm-eval-") as folder:
            os.environ["HF_HOME"] = os.path.join(folder, "hf")
            write_tasks(folder)
            srv = LocalServer(FERRUMCTL, ["--model", MODEL, "--host", "127.0.0.1", "--served-model-name", NAME,
                                          "--max-model-len", "512", "--threads", "2"])
            try:
                out = run_harness(srv, folder)
            finally:
                srv.stop()
        ref = Llama()
        # log-likelihoods, request by request
        acc_ref, worst, n_req, greedy_diff = [], 0.0, 0, 0
        for s in out["samples"]["ferrum_choice"]:
            lls = []
            for (context, continuation), resp in zip(s["arguments"], s["resps"]):  # one request per choice
                ll, greedy = resp[0]
                rll, rgreedy = ref.loglikelihood(context, continuation)
                worst = max(worst, abs(ll - rll))
                greedy_diff += greedy != rgreedy
                n_req += 1
                lls.append(rll)
            acc_ref.append(float(max(range(len(lls)), key=lls.__getitem__) == s["target"]))
        acc = out["results"]["ferrum_choice"]["acc,none"]
        acc_llama = sum(acc_ref) / len(acc_ref)
        print("ferrum_choice: %d requests, max |loglikelihood diff| %.4f nats, is_greedy differs on %d; acc ferrum %.4f, "
              "llama.cpp %.4f" % (n_req, worst, greedy_diff, acc, acc_llama))
        self.assertEqual(n_req, 48)
        self.assertLessEqual(worst, LL_TOL)
        self.assertLessEqual(greedy_diff, 2)
        self.assertLessEqual(abs(acc - acc_llama), ACC_TOL)
        # generations
        preds, refs, same = [], [], 0
        for s in out["samples"]["ferrum_qa"]:
            context, gen_kw = s["arguments"][0]
            got = s["resps"][0][0]
            want = ref.generate(context, gen_kw["until"], gen_kw.get("max_gen_toks", 12))
            for u in gen_kw["until"]:
                want = want.split(u)[0]
            same += got == want
            preds.append(want)
            refs.append(s["target"])
        em = out["results"]["ferrum_qa"]["exact_match,none"]
        em_llama = exact_match_hf_evaluate(preds, refs, ignore_case=True, ignore_punctuation=True)["exact_match"]
        print("ferrum_qa: %d docs, %d generations identical; exact_match ferrum %.4f, llama.cpp %.4f"
              % (len(refs), same, em, em_llama))
        self.assertEqual(len(refs), 8)
        self.assertGreaterEqual(same, 6)
        self.assertLessEqual(abs(em - em_llama), EM_TOL)


if __name__ == "__main__":
    try:
        import lm_eval  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError as e:
        print("skip: %s" % e)
        sys.exit(77)
    if not MODEL or not os.path.exists(MODEL) or not FERRUMCTL:
        print("skip: FERRUM_MODEL / FERRUMCTL not set")
        sys.exit(77)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    unittest.main(verbosity=2)
