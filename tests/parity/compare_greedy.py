#!/usr/bin/env python3
"""Compares two run_model outputs (JSON: greedy tokens and top-5 per step)
with vLLM's rule: equal, or at the first divergence each side's token is
in the other's top-5. usage: compare_greedy.py LABEL JSON_A JSON_B"""
import json
import sys

label, a, b = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
ga, gb = a["greedy"], b["greedy"]
div = next((i for i, (x, y) in enumerate(zip(ga, gb)) if x != y), None)
if len(ga) != len(gb):
    print(f"{label}: lengths differ ({len(ga)} vs {len(gb)})  FAIL")
    sys.exit(1)
if div is None:
    print(f"{label}: all {len(ga)} greedy tokens equal  PASS")
    sys.exit(0)
ok = ga[div] in b["top5"][div] and gb[div] in a["top5"][div]
print(f"{label}: equal for {div} tokens, then {ga[div]} vs {gb[div]}: "
      f"{'each in the other top-5  PASS' if ok else 'NOT in the other top-5  FAIL'}")
sys.exit(0 if ok else 1)
