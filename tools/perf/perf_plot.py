#!/usr/bin/env python3
"""Plot bus bandwidth (or time) against size for one or several perf runs.

Reads the tables the *_perf tools print (with or without weftrun's "[0]"
prefix, and the same format from other benchmarks such as the baselines'
mpi_coll_bench), or the JSON files written with -J (nccl-tests' format, which
weft's tools write too). Writes an SVG image with
no dependency beyond Python 3; a .png output name uses matplotlib when it is
installed.

    tools/perf/perf_plot.py -o busbw.svg weft=run1.txt mpi=ompi.txt run2.json
    tools/perf/perf_plot.py --column in --metric time -o time.svg run.txt

Each input is FILE or LABEL=FILE. A file holding several tables (one per
collective, datatype or op) gives one series per table.
"""
import argparse
import json
import math
import os
import re
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]
METRICS = {"busbw": ("bus bandwidth (GB/s)", 2), "algbw": ("algorithm bandwidth (GB/s)", 1),
           "time": ("time (us)", 0)}
ROW = re.compile(r"^(?:\[\d+\])?\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+(.*)$")


def parse_text(text, column, metric):
    """Series {key: [(size, value)]} from nccl-tests style tables."""
    series, section = {}, ""
    offset = METRICS[metric][1] + (4 if column == "in" else 0)
    for line in text.splitlines():
        m = re.match(r"^(?:\[\d+\])?\s*#\s*Collective:\s*(\S+)", line)
        if m:
            section = m.group(1)
            continue
        m = ROW.match(line)
        if not m:
            continue
        fields = m.group(6).split()
        if len(fields) <= offset:
            continue
        try:
            value = float(fields[offset])
        except ValueError:  # N/A in-place columns
            continue
        key = " ".join(k for k in (section, m.group(3), m.group(4) if m.group(4) != "none" else "")
                       if k)
        series.setdefault(key, []).append((int(m.group(1)), value))
    return series


def parse_json(doc, column, metric):
    """Series from a -J file: nccl-tests' "results" (time or cpu_time, alg_bw,
    bus_bw; the collective from the program in "args")."""
    series = {}
    side_key = "out_of_place" if column == "out" else "in_place"
    args = doc.get("args") or [""]
    coll = os.path.basename(args[0])
    coll = coll[:-len("_perf")] if coll.endswith("_perf") else coll
    for row in doc.get("results", []):
        part = row.get(side_key)
        if not part:
            continue
        value = part.get({"busbw": "bus_bw", "algbw": "alg_bw"}.get(metric, "time"),
                         part.get("cpu_time"))
        if value is None:
            continue
        key = " ".join(k for k in (coll, row.get("type", ""),
                                   row.get("redop", "") if row.get("redop") != "none" else "")
                       if k)
        series.setdefault(key, []).append((int(row["size"]), float(value)))
    return series


def load(spec, column, metric):
    label, path = (spec.split("=", 1) if "=" in spec and not os.path.exists(spec)
                   else (None, spec))
    with open(path) as f:
        text = f.read()
    try:
        series = parse_json(json.loads(text), column, metric)
    except ValueError:
        series = parse_text(text, column, metric)
    if not series:
        sys.exit(f"perf_plot: no table rows in {path}")
    base = label or os.path.splitext(os.path.basename(path))[0]
    if len(series) == 1:
        return [(base, next(iter(series.values())))]
    return [(f"{base} {key}", pts) for key, pts in series.items()]


def size_label(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}"


def nice_step(span):
    raw = span / 6
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for mult in (1, 2, 2.5, 5, 10):
        if mult * mag >= raw:
            return mult * mag
    return 10 * mag


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_svg(path, runs, title, ylabel, log_y):
    W, H, L, R, T, B = 900, 540, 80, 250, 50, 60
    pw, ph = W - L - R, H - T - B
    sizes = [s for _, pts in runs for s, _ in pts if s > 0]
    values = [v for _, pts in runs for _, v in pts if (v > 0 or not log_y)]
    xlo, xhi = math.log2(min(sizes)), math.log2(max(sizes))
    if xhi == xlo:
        xhi = xlo + 1
    if log_y:
        ylo = math.floor(math.log10(min(v for v in values if v > 0)))
        yhi = math.ceil(math.log10(max(values)))
        yhi = yhi if yhi > ylo else ylo + 1
    else:
        ylo, yhi = 0.0, max(values) * 1.08 if values and max(values) > 0 else 1.0

    def x(s):
        return L + (math.log2(s) - xlo) / (xhi - xlo) * pw

    def y(v):
        if log_y:
            v = math.log10(max(v, 10 ** ylo))
        return T + ph - (v - ylo) / (yhi - ylo) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L + pw / 2}" y="25" text-anchor="middle" font-size="16">{esc(title)}</text>']
    # grid and ticks
    step = max(1, round((xhi - xlo) / 10))
    e = math.ceil(xlo)
    while e <= xhi:
        px = x(2 ** e)
        out.append(f'<line x1="{px:.1f}" y1="{T}" x2="{px:.1f}" y2="{T + ph}" stroke="#ddd"/>')
        out.append(f'<text x="{px:.1f}" y="{T + ph + 18}" text-anchor="middle">'
                   f'{size_label(2 ** e)}</text>')
        e += step
    ticks = []
    if log_y:
        ticks = [10 ** k for k in range(int(ylo), int(yhi) + 1)]
    else:
        st = nice_step(yhi - ylo)
        ticks = [k * st for k in range(int(yhi / st) + 1)]
    for v in ticks:
        py = y(v)
        out.append(f'<line x1="{L}" y1="{py:.1f}" x2="{L + pw}" y2="{py:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{py + 4:.1f}" text-anchor="end">{v:g}</text>')
    out.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    out.append(f'<text x="{L + pw / 2}" y="{H - 15}" text-anchor="middle">size (bytes)</text>')
    out.append(f'<text transform="translate(20 {T + ph / 2}) rotate(-90)" '
               f'text-anchor="middle">{esc(ylabel)}</text>')
    # series and legend
    for i, (label, pts) in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        pts = sorted(p for p in pts if p[0] > 0)
        line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in pts)
        out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        for s, v in pts:
            out.append(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" fill="{color}"/>')
        ly = T + 10 + 20 * i
        out.append(f'<line x1="{L + pw + 15}" y1="{ly}" x2="{L + pw + 40}" y2="{ly}" '
                   f'stroke="{color}" stroke-width="3"/>')
        out.append(f'<text x="{L + pw + 46}" y="{ly + 4}">{esc(label)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def write_png(path, runs, title, ylabel, log_y):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.4))
    for label, pts in runs:
        pts = sorted(p for p in pts if p[0] > 0)
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=100, bbox_inches="tight")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="FILE or LABEL=FILE (table text or -J JSON)")
    ap.add_argument("-o", "--output", default="perf.svg", help="image file (.svg, or .png "
                    "with matplotlib)")
    ap.add_argument("--column", choices=["out", "in"], default="out",
                    help="out-of-place (default) or in-place columns")
    ap.add_argument("--metric", choices=sorted(METRICS), default="busbw")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    runs = [run for spec in args.inputs for run in load(spec, args.column, args.metric)]
    ylabel = METRICS[args.metric][0]
    title = args.title or f"{args.metric}, {'in' if args.column == 'in' else 'out-of'}-place"
    log_y = args.metric == "time"
    if args.output.endswith(".png"):
        try:
            write_png(args.output, runs, title, ylabel, log_y)
        except ImportError:
            sys.exit("perf_plot: .png needs matplotlib (pip install matplotlib); "
                     "write .svg instead")
    else:
        write_svg(args.output, runs, title, ylabel, log_y)
    print(f"perf_plot: {len(runs)} series -> {args.output}")


if __name__ == "__main__":
    main()
