#!/usr/bin/env python3
"""Where a decode step's time goes inside the CUDA graph, from a trace build.

Build with -DFERRUM_CUDA_TRACE=ON (kernels/cuda/kcu_trace.cuh), run a decode
benchmark, and pipe its stderr here:

  build/bin/model_bench --dummy llama-3-8b --device cuda --prefill 0 \\
      --prompt 128 --gen 17 --batch 1 --type i4g 2>&1 | bench/cuda_trace.py 4

Each "TR name entry wait exit ctas" line is CTA 0 of one traced kernel (ns).
A kernel's successor passes its PDL wait once the kernel has finished, so a
kernel's cost on the critical path is the time from its own wait to its
successor's. Steps end at the sampling kernel; the last N full steps
(argument, default 4) are summed per kernel and grid size. Untraced kernels'
time lands on the traced kernel before them. The gap between consecutive
steps (one sampler's exit to the next step's first traced kernel) is the
host's turn: the result copy, the next step's metadata copy and its launch.
"TRM name entry m0 .. m7" lines are the points a kernel marks in its body
(KCU_TRACE_MARK): each mark's mean time after the kernel's wait, per kernel
and grid size, over the same steps (nan: a mark that CTA 0 never reached).
"""
import collections
import sys


def main():
    n_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    ev, marks = [], {}
    for line in sys.stdin:
        p = line.split()
        if len(p) == 6 and p[0] == "TR":
            ev.append((int(p[2]), int(p[3]), int(p[4]), p[1], int(p[5])))
        elif len(p) > 3 and p[0] == "TRM":
            marks[(p[1], int(p[2]))] = [int(x) for x in p[3:]]
    ev.sort()
    steps, cur = [], []
    for e in ev:
        cur.append(e)
        if e[3] == "sample":
            steps.append(cur)
            cur = []
    steps = [s for s in steps if len(s) > 2][-n_steps:]
    if not steps:
        sys.exit("cuda_trace: no full step in the input (a FERRUM_CUDA_TRACE build's stderr?)")
    cost, run, pre = (collections.defaultdict(list) for _ in range(3))
    spans = []
    for s in steps:
        spans.append((s[-1][2] - s[0][0]) / 1e3)
        for i in range(len(s) - 1):
            label = "%s/%d" % (s[i][3], s[i][4])
            cost[label].append((s[i + 1][1] - s[i][1]) / 1e3)
            run[label].append((s[i][2] - s[i][1]) / 1e3)
            pre[label].append((s[i][1] - s[i][0]) / 1e3)
    print("steps %d, first entry to last exit (us): %s" % (len(steps), " ".join("%.1f" % t for t in spans)))
    gaps = [(b[0][0] - a[-1][2]) / 1e3 for a, b in zip(steps, steps[1:])]
    if gaps:
        print("between steps, the sampler's exit to the next step's first entry (us): %s"
              % " ".join("%.1f" % t for t in gaps))
    print("%-18s %7s %9s %9s %11s %12s" % ("kernel/ctas", "a step", "cost us", "us a step", "wait->exit", "entry->wait"))
    for k in sorted(cost, key=lambda k: -sum(cost[k])):
        c = cost[k]
        row = (k, len(c) / len(steps), sum(c) / len(c), sum(c) / len(steps), sum(run[k]) / len(c),
               sum(pre[k]) / len(c))
        print("%-18s %7.0f %9.2f %9.1f %11.2f %12.2f" % row)
    print_marks(steps, marks)


def print_marks(steps, marks):
    """Each marked kernel's mean mark times after its wait (us)."""
    after = collections.defaultdict(list)
    for s in steps:
        for e in s:
            m = marks.get((e[3], e[0]))
            if m:
                after["%s/%d" % (e[3], e[4])].append([(t - e[1]) / 1e3 if t else float("nan") for t in m])
    if after:
        print("marks after the wait (us)")
    for k, rows in sorted(after.items()):
        mean = [sum(r[i] for r in rows) / len(rows) for i in range(len(rows[0]))]
        print("%-18s %s" % (k, " ".join("%6.2f" % t for t in mean)))


if __name__ == "__main__":
    main()
