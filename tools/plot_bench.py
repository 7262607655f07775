#!/usr/bin/python3
"""Draws kvhead_bench's JSON (Google Benchmark --benchmark_out_format=json) as PNG charts.

  /usr/bin/python3 tools/plot_bench.py build/release/bench.json [--peer torch1.json --peer onednn1.json ...]
                                       [--out DIR]

Charts, into DIR (default: plots/ next to the JSON):
  s_shapes.png        time per S shape (1 and 2 threads) against its floor (the time the
                      machine's limit would allow: flops / FMA peak or bytes / DRAM read, the
                      benchmark's floor_ms counter), the textbook baseline and
                      the peers when given (tools/peer_torch.py, tools/peer_onednn: one series
                      per peer, named by the prefix of its rows, torch_ or onednn_);
  decode_sweep.png    decode latency against past length, one layer step over the cache
                      against recomputing the prefix, and the attention alone (log-log);
  prefill_sweep.png   prefill GFLOP/s against sequence length, with the FMA peak;
  thread_scaling.png  2-thread speed-up over 1 thread for the S shapes and gemm.
Every chart names the CPU model and the limits measured by the same run (from the
JSON's context). Repeated runs are reduced to their median; rows that errored are
skipped, and a chart with no rows to draw is skipped with a note. Needs matplotlib
(Debian: apt-get install python3-matplotlib).
"""

import argparse
import json
import math
import os
import re
import sys

S_SHAPES = ["S1_decode_gqa", "S2_prefill_gqa_causal", "S3_mha_layer", "S4_decode_mqa", "S5_decode_ragged16"]
TIME_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


class InputError(Exception):
    """A JSON that cannot be read: named on one line, not as a traceback."""


def load_runs(path):
    """The JSON's context and its runs by name (without /real_time), medians only."""
    try:
        with open(path) as f:
            report = json.load(f)
    except OSError as error:
        raise InputError(f"{path}: {error.strerror}")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a benchmark JSON ({error})")
    if not isinstance(report, dict) or not isinstance(report.get("benchmarks", []), list):
        raise InputError(f"{path}: not a benchmark JSON (no object at the top, or no list of benchmarks)")
    context = report.get("context", {})
    if not isinstance(context, dict):
        raise InputError(f"{path}: not a benchmark JSON (its context is not an object)")
    runs = {}
    for index, row in enumerate(report.get("benchmarks", [])):
        if not isinstance(row, dict):
            raise InputError(f"{path}: benchmark {index} is not an object")
        if row.get("error_occurred"):
            continue
        if row.get("run_type") == "aggregate" and row.get("aggregate_name") != "median":
            continue
        name = row.get("run_name", row.get("name"))
        numbers = ["real_time"] + [key for key in ("floor_ms", "pct_peak", "pct_dram", "gflops") if key in row]
        if not isinstance(name, str) or row.get("time_unit", "ns") not in TIME_UNIT_SECONDS or not all(
                isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool) for key in numbers):
            raise InputError(f"{path}: benchmark {index} lacks a name, a time or a unit, or has a counter that "
                             "is not a number")
        row["seconds"] = row["real_time"] * TIME_UNIT_SECONDS[row.get("time_unit", "ns")]
        runs[name.replace("/real_time", "")] = row
    return context, runs


class Machine:
    """The CPU model and the limits of the run, from the context entries bench/machine_context.cpp adds."""

    def __init__(self, context):
        self.cpu = context.get("cpu_model", context.get("host_name", "unknown CPU"))
        self.simd = context.get("simd_path", "?")
        self.peak = {t: float(context.get(f"fma_peak_gflops/threads:{t}", "nan")) for t in (1, 2)}
        self.dram = {t: float(context.get(f"dram_read_gbps/threads:{t}", "nan")) for t in (1, 2)}

    def limits_text(self):
        return (f"FMA peak ({self.simd}) {self.peak[1]:.0f} / {self.peak[2]:.0f} GFLOP/s, "
                f"DRAM read {self.dram[1]:.1f} / {self.dram[2]:.1f} GB/s (1 / 2 threads)")

    def title(self, what):
        return f"{what}\n{self.cpu}: {self.limits_text()}"


def floor_seconds(run):
    """The time the bounding limit allows: the benchmark's floor_ms (older JSONs: the measured time times the
    percentage of the limit reached, exact for an odd number of repetitions only)."""
    if "floor_ms" in run:
        return run["floor_ms"] * 1e-3
    percent = run.get("pct_peak", run.get("pct_dram"))
    return None if percent is None else run["seconds"] * percent / 100.0


PEER_COLOURS = ["tab:red", "tab:green", "tab:purple", "tab:brown"]


def plot_s_shapes(plt, machine, runs, peers, out):
    """peers: (label, name prefix, runs) of each peer, its rows named <prefix>_<shape>/threads:<t>."""
    series = [("kvhead", "{shape}/threads:{t}", runs, "tab:blue"),
              ("floor: flops / FMA peak or bytes / DRAM read", None, runs, "0.75"),
              ("textbook (OpenBLAS sgemm + scalar softmax)", "textbook_{shape}/threads:{t}", runs, "tab:orange")]
    for (label, prefix, peer_runs), colour in zip(peers, PEER_COLOURS):
        series.append((label, prefix + "_{shape}/threads:{t}", peer_runs, colour))
    thread_counts = [t for t in (1, 2) if any(f"{shape}/threads:{t}" in runs for shape in S_SHAPES)]
    if not thread_counts:
        return False
    fig, axes = plt.subplots(1, len(thread_counts), figsize=(7 * len(thread_counts) + 1, 6), sharey=True,
                             squeeze=False)
    width = 0.8 / len(series)
    for ax, threads in zip(axes[0], thread_counts):
        for i, (label, pattern, source, colour) in enumerate(series):
            xs, ys = [], []
            for x, shape in enumerate(S_SHAPES):
                kvhead_run = runs.get(f"{shape}/threads:{threads}")
                if pattern is None:
                    seconds = floor_seconds(kvhead_run) if kvhead_run else None
                else:
                    run = source.get(pattern.format(shape=shape, t=threads))
                    seconds = run["seconds"] if run else None
                if seconds:
                    xs.append(x + (i - (len(series) - 1) / 2) * width)
                    ys.append(seconds * 1e3)
            bars = ax.bar(xs, ys, width, label=label, color=colour)
            ax.bar_label(bars, fmt="%.3g", fontsize=7, rotation=90, padding=2)
        ax.set_yscale("log")
        ax.margins(y=0.15)
        ax.set_xticks(range(len(S_SHAPES)), [s.replace("_", "\n", 1) for s in S_SHAPES], fontsize=8)
        ax.set_title(f"{threads} thread{'s' if threads > 1 else ''}", fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per call (ms, log scale)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(series), 2 * len(thread_counts)), fontsize=8,
               frameon=False)
    fig.suptitle(machine.title("S shapes: time per call against the machine's floor and the baselines"), fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def swept(runs, pattern):
    """(x, run) pairs of the runs whose name matches pattern (one integer group), by x."""
    points = []
    for name, run in runs.items():
        match = re.fullmatch(pattern, name)
        if match:
            points.append((int(match.group(1)), run))
    return sorted(points, key=lambda point: point[0])


def plot_decode_sweep(plt, machine, runs, out):
    lines = [("layer step over the KV cache", r"decode_sweep_layer/past:(\d+)/cache:1/threads:1", "tab:blue", "o"),
             ("layer without a cache (recompute past + 1 tokens)", r"decode_sweep_layer/past:(\d+)/cache:0/threads:1",
              "tab:red", "s"),
             ("attention only over the cache (S1 kernel)", r"decode_sweep/past:(\d+)/threads:1", "tab:green", "^")]
    if not any(swept(runs, pattern) for _, pattern, _, _ in lines):
        return False
    fig, ax = plt.subplots(figsize=(9, 6))
    for label, pattern, colour, marker in lines:
        points = swept(runs, pattern)
        if not points:
            continue
        xs = [p for p, _ in points]
        ax.plot(xs, [r["seconds"] * 1e3 for _, r in points], marker=marker, color=colour, label=label)
        ax.plot(xs, [floor_seconds(r) * 1e3 for _, r in points], linestyle="--", color=colour, alpha=0.5,
                label=f"  its floor ({'DRAM read' if 'pct_dram' in points[0][1] else 'FMA peak'})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("past length (tokens, log scale)")
    ax.set_ylabel("latency of one decoded token (ms, log scale)")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(machine.title("Decode, 1 thread, S1 geometry (32 q / 8 kv heads, d 128, d_model 4096)"), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def plot_prefill_sweep(plt, machine, runs, out):
    points = swept(runs, r"prefill_sweep/tokens:(\d+)/threads:1")
    if not points:
        return False
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.plot([n for n, _ in points], [r["gflops"] for _, r in points], marker="o", label="kvhead causal attention")
    ax.axhline(machine.peak[1], color="tab:red", linestyle="--", label=f"FMA peak, 1 thread ({machine.peak[1]:.0f} GFLOP/s)")
    ax.set_xscale("log", base=2)
    if not math.isnan(machine.peak[1]):
        ax.set_ylim(0, machine.peak[1] * 1.15)
    ax.set_xlabel("sequence length (tokens, log scale)")
    ax.set_ylabel("GFLOP/s (4 H d L(L+1)/2 flops per call)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(machine.title("Prefill, 1 thread, S2 geometry (32 q / 8 kv heads, d 128, causal)"), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def plot_thread_scaling(plt, machine, runs, out):
    gemms = [name[:-len("/threads:1")] for name in runs if re.fullmatch(r"gemm/M:\d+/N:\d+/K:\d+/threads:1", name)]
    names = S_SHAPES + sorted(gemms, key=lambda name: [int(size) for size in re.findall(r"\d+", name)])
    labels, speedups = [], []
    for name in names:
        one, two = runs.get(f"{name}/threads:1"), runs.get(f"{name}/threads:2")
        if one and two:
            labels.append(name)
            speedups.append(one["seconds"] / two["seconds"])
    if not labels:
        return False
    fig, ax = plt.subplots(figsize=(11, 6))
    bars = ax.bar(range(len(labels)), speedups, color="tab:blue")
    ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(2.0, color="0.4", linestyle=":", label="2x (linear)")
    ax.axhline(machine.peak[2] / machine.peak[1], color="tab:red", linestyle="--",
               label=f"FMA peak 2 / 1 threads ({machine.peak[2] / machine.peak[1]:.2f}x)")
    ax.axhline(machine.dram[2] / machine.dram[1], color="tab:green", linestyle="--",
               label=f"DRAM read 2 / 1 threads ({machine.dram[2] / machine.dram[1]:.2f}x)")
    ax.set_xticks(range(len(labels)), [n.replace("/", " ").replace("_", " ", 1) for n in labels], fontsize=7,
                  rotation=30, ha="right")
    ax.set_ylabel("speed-up, 2 threads over 1 (time ratio)")
    ax.set_ylim(0, 2.4)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(machine.title("Thread scaling: S shapes and kvhead gemm"), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench_json", help="kvhead_bench --benchmark_out=... --benchmark_out_format=json")
    parser.add_argument("--peer", action="append", default=[],
                        help="a peer's JSON in the same shape (tools/peer_torch.py or tools/peer_onednn --out); "
                             "repeat for more thread counts and more peers")
    parser.add_argument("--out", help="directory for the PNGs (default: plots/ next to bench_json)")
    args = parser.parse_args()
    try:
        context, runs = load_runs(args.bench_json)
        peer_files = [load_runs(path) for path in args.peer]
    except InputError as error:
        print(f"plot_bench.py: {error}", file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_bench.py: matplotlib is missing: apt-get install python3-matplotlib", file=sys.stderr)
        return 2
    peers = {}  # name prefix (torch, onednn) -> [label, runs]: one series per peer, its files' runs merged
    for context_of_file, runs_of_file in peer_files:
        for name in runs_of_file:
            prefix = name.split("_S", 1)[0]
            entry = peers.setdefault(prefix, [context_of_file.get("peer", prefix), {}])
            entry[1][name] = runs_of_file[name]
    peer_series = [(label, prefix, peer_runs) for prefix, (label, peer_runs) in peers.items()]
    machine = Machine(context)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.bench_json)), "plots")
    os.makedirs(out, exist_ok=True)
    charts = {"s_shapes.png": lambda path: plot_s_shapes(plt, machine, runs, peer_series, path),
              "decode_sweep.png": lambda path: plot_decode_sweep(plt, machine, runs, path),
              "prefill_sweep.png": lambda path: plot_prefill_sweep(plt, machine, runs, path),
              "thread_scaling.png": lambda path: plot_thread_scaling(plt, machine, runs, path)}
    for file_name, draw in charts.items():
        path = os.path.join(out, file_name)
        print(path if draw(path) else f"{file_name}: skipped (the JSON has none of its rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
