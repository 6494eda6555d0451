#!/usr/bin/env python3
"""serve_plot.py - latency against throughput for several engines, as an SVG
(no plotting package needed): one line per engine through its concurrency
sweep, median end-to-end latency (p50) on y against output tok/s on x, each
point the median over rounds and labelled with its concurrency.

Input: `ferrumctl bench --result-file` JSON files named ENGINE-ROUND.json in
one folder (what bench/cpu_serve_vs_llamacpp.sh writes).

usage: serve_plot.py DIR OUT.svg [--title T]
"""
import argparse
import glob
import json
import math
import os
import statistics

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
W, H, L, R, T, B = 720, 480, 80, 170, 50, 60  # size and margins


def load(folder):
    """{engine: [(concurrency, out tok/s, e2e p50 s)]}, medians over rounds."""
    runs = {}
    for p in sorted(glob.glob(os.path.join(folder, "*-*.json"))):
        engine = os.path.basename(p).rsplit("-", 1)[0]
        d = json.load(open(p))
        for run in d.get("runs", [d]):
            if run.get("completed", 0) and not run.get("failed", 0):
                key = (engine, run["max_concurrency"])
                runs.setdefault(key, []).append((run["output_throughput"], run["median_e2el_ms"] / 1e3))
    out = {}
    for (engine, c), v in sorted(runs.items()):
        out.setdefault(engine, []).append((c, statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)))
    return out


def nice_ticks(hi, n=5):
    """Round tick values from 0 to at least hi."""
    step = 10 ** math.floor(math.log10(hi / n)) if hi > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if hi / (step * m) <= n:
            step *= m
            break
    return [i * step for i in range(int(math.ceil(hi / step)) + 1)]


def svg(series, title):
    xs = nice_ticks(max(p[1] for s in series.values() for p in s) * 1.05)
    ys = nice_ticks(max(p[2] for s in series.values() for p in s) * 1.05)
    px = lambda x: L + (W - L - R) * x / xs[-1]
    py = lambda y: H - B - (H - T - B) * y / ys[-1]
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
         % (W, H), '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="24" font-size="15" text-anchor="middle">%s</text>' % (W // 2, title)]
    for x in xs:
        o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (px(x), T, px(x), H - B))
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (px(x), H - B + 16, x))
    for y in ys:
        o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, py(y), W - R, py(y)))
        o.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (L - 6, py(y) + 4, y))
    o.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>' % (L, T, W - L - R, H - T - B))
    o.append('<text x="%d" y="%d" text-anchor="middle">output tokens/s</text>' % ((L + W - R) // 2, H - 20))
    o.append('<text x="20" y="%d" text-anchor="middle" transform="rotate(-90 20 %d)">median end-to-end latency (s)'
             '</text>' % ((T + H - B) // 2, (T + H - B) // 2))
    for i, (engine, pts) in enumerate(sorted(series.items())):
        col = COLORS[i % len(COLORS)]
        o.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                 % (col, " ".join("%.1f,%.1f" % (px(p[1]), py(p[2])) for p in pts)))
        for c, x, y in pts:
            o.append('<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>' % (px(x), py(y), col))
            o.append('<text x="%.1f" y="%.1f" fill="%s">c=%d</text>' % (px(x) + 6, py(y) - 6, col, c))
        o.append('<rect x="%d" y="%d" width="14" height="4" fill="%s"/>' % (W - R + 16, T + 10 + 20 * i, col))
        o.append('<text x="%d" y="%d">%s</text>' % (W - R + 36, T + 16 + 20 * i, engine))
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("out")
    ap.add_argument("--title", default="latency against throughput")
    a = ap.parse_args()
    series = load(a.dir)
    if not series:
        raise SystemExit("serve_plot: no completed runs in " + a.dir)
    with open(a.out, "w") as f:
        f.write(svg(series, a.title))
    for engine, pts in sorted(series.items()):
        print("%s: %s" % (engine, ", ".join("c=%d %.1f tok/s %.2f s" % p for p in pts)))


if __name__ == "__main__":
    main()
