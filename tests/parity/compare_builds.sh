#!/usr/bin/env bash
# Two builds of run_model on the GPU (device machine, after `source .device/env.sh`):
# the same dummy weights and ids, the last prompt token's logits compared bit
# for bit, and 16 greedy tokens. Extra environment (e.g. FERRUM_CUDA_SIMT_PREFILL=1
# to force the SIMT prefill kernel) applies to both.
# usage: compare_builds.sh OLD_RUN_MODEL NEW_RUN_MODEL OUT_DIR
set -u
old=$1 new=$2 out=$3
mkdir -p "$out"
ids=$(python3 -c "import random; random.seed(5); print(','.join(str(random.randrange(100, 40000)) for _ in range(300)))")
for spec in smollm2-135m:bf16 qwen3-0.6b:bf16; do
  name=${spec%%:*}
  for v in old new; do
    bin=$old; [ $v = new ] && bin=$new
    "$bin" --dummy "$name" --device cuda --ids "$ids" --greedy 16 --logits-out "$out/$name.$v.f32" > "$out/$name.$v.json" 2>/dev/null || echo "$name $v failed"
  done
  python3 - "$out/$name.old.f32" "$out/$name.new.f32" "$out/$name.old.json" "$out/$name.new.json" "$name" <<'PY'
import sys, numpy as np
a = np.fromfile(sys.argv[1], dtype=np.float32); b = np.fromfile(sys.argv[2], dtype=np.float32)
ta = open(sys.argv[3]).read().strip(); tb = open(sys.argv[4]).read().strip()
print(f"{sys.argv[5]}: old vs new: max |dlogit| {np.abs(a - b).max():.3e}, bit-identical {np.array_equal(a, b)}, greedy equal {ta == tb}")
PY
done
