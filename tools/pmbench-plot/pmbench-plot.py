#!/usr/bin/env python3
"""pmbench-plot: turns pmbench --json results into PNG charts.

Usage: pmbench-plot RESULT.json [MORE.json ...] [-o OUT_DIR] [--prefix NAME]

Writes, for the runs in all given files (each index of each file is one
series; series from several files are labelled "index (file)"):
  NAME-throughput.png  throughput per phase and index (bars; error bars are the
                       standard deviation over sampling windows, as in PiBench)
  NAME-timeline.png    throughput over time (one panel per phase, sampling windows)
  NAME-latency.png     latency percentiles p50 .. p99.999 and max (one panel per phase)
  NAME-pmcost.png      PM lines flushed, fences and allocations per operation
                       (only when an index reported PM costs)
NAME defaults to the first file's name without .json; OUT_DIR to its folder.
See docs/pmbench.md.
"""
import argparse
import json
import os
import sys


def _import_matplotlib():
    try:
        import matplotlib
    except ImportError:
        # A Python without matplotlib first on PATH (e.g. pyenv): retry with
        # the system interpreter, which has Debian's python3-matplotlib.
        system = "/usr/bin/python3"
        if os.path.realpath(sys.executable) != os.path.realpath(system) and os.path.exists(system) \
                and not os.environ.get("PMBENCH_PLOT_REEXEC"):
            os.environ["PMBENCH_PLOT_REEXEC"] = "1"
            os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
        sys.exit("pmbench-plot: matplotlib is missing (apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


PERCENTILES = ["p50", "p90", "p99", "p99.9", "p99.99", "p99.999", "max"]


def load_series(paths):
    """Returns (series, phase_order); a series is one index of one file."""
    series, phases = [], []
    many = len(paths) > 1
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit("pmbench-plot: cannot read %s: %s" % (path, e))
        if doc.get("tool") != "pmbench" or "results" not in doc:
            sys.exit("pmbench-plot: %s is not a pmbench --json result" % path)
        tag = os.path.splitext(os.path.basename(path))[0]
        for r in doc["results"]:
            label = r["name"] + (" (%s)" % tag if many else "")
            ph = {}
            if r.get("load"):
                ph["load"] = r["load"]
            for p in r.get("phases", []):
                if not p.get("skipped"):
                    ph[p["name"]] = p
            for name in ph:
                if name not in phases:
                    phases.append(name)
            series.append({"label": label, "phases": ph, "threads": r.get("threads"), "error": r.get("error")})
    return series, phases


def grid(plt, n, w=5.0, h=3.4):
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def plot_throughput(plt, series, phases, title, out):
    wide = 2.0 + len(phases) * (0.6 + 0.3 * len(series))
    fig, ax = plt.subplots(figsize=(min(16.0, max(7.0, wide)), 5.0))
    width = 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        xs, ys, es = [], [], []
        for j, ph in enumerate(phases):
            p = s["phases"].get(ph)
            if p is None:
                continue
            xs.append(j + (i - (len(series) - 1) / 2) * width)
            ys.append(p["ops_per_sec"] / 1e6)
            es.append(p.get("windows", {}).get("stddev_ops_per_sec", 0) / 1e6)
        ax.bar(xs, ys, width, yerr=es, capsize=2, label=s["label"])
    ax.set_xticks(range(len(phases)))
    ax.set_xticklabels(phases)
    ax.set_ylabel("throughput (Mops/s)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_timeline(plt, series, phases, title, out):
    fig, axes = grid(plt, len(phases))
    for ax, ph in zip(axes, phases):
        for s in series:
            p = s["phases"].get(ph)
            if p is None:
                continue
            win = p.get("windows", {})
            # Leave out a short final window (its rate is noise), as the
            # mean/stddev in the JSON do.
            half = win.get("sampling_ms", 0) / 2000.0
            w = [x for x in win.get("list", []) if x["seconds"] >= half] or win.get("list", [])
            if not w:
                continue
            ax.plot([x["end_s"] for x in w], [x["ops_per_sec"] / 1e6 for x in w], marker=".", label=s["label"])
        ax.set_title(ph)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("Mops/s per window")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    if axes:
        axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def plot_latency(plt, series, phases, title, out):
    phases = [ph for ph in phases if any(
        s["phases"].get(ph, {}).get("latency_ns", {}).get("all", {}).get("samples", 0) for s in series)]
    if not phases:
        return False
    fig, axes = grid(plt, len(phases))
    for ax, ph in zip(axes, phases):
        for s in series:
            lat = s["phases"].get(ph, {}).get("latency_ns", {}).get("all", {})
            if not lat.get("samples"):
                continue
            ax.plot(PERCENTILES, [max(lat[q], 1) / 1e3 for q in PERCENTILES], marker="o", label=s["label"])
        ax.set_yscale("log")
        ax.set_title(ph)
        ax.set_ylabel("latency (us)")
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def plot_pmcost(plt, series, phases, title, out):
    metrics = [("lines_flushed", "lines flushed / op"), ("fences", "fences / op"), ("allocs", "allocations / op")]
    inst = [s for s in series if any(p.get("pm_cost", {}).get("instrumented") for p in s["phases"].values())]
    if not inst:
        return False
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4), squeeze=False)
    width = 0.8 / len(inst)
    for ax, (key, label) in zip(axes[0], metrics):
        for i, s in enumerate(inst):
            xs, ys = [], []
            for j, ph in enumerate(phases):
                p = s["phases"].get(ph)
                if p is None:
                    continue
                xs.append(j + (i - (len(inst) - 1) / 2) * width)
                ys.append(p.get("pm_cost", {}).get("per_op", {}).get(key, 0))
            ax.bar(xs, ys, width, label=s["label"])
        ax.set_xticks(range(len(phases)))
        ax.set_xticklabels(phases, fontsize=8)
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def describe(paths):
    try:
        with open(paths[0]) as f:
            o = json.load(f)["options"]
    except (OSError, ValueError, KeyError):
        return ""
    workload = "%s ops/phase" % o["operations"] if o.get("mode") == "operation" else "%ss/phase" % o.get("seconds")
    dist = o.get("distribution", "")
    if dist and dist != "UNIFORM":
        dist += " %s" % o.get("skew")
    return "%s records, %s, %s thread(s), %s-byte keys, %s-byte values, %s, persist %s" % (
        o["records"], workload, o["threads"], o["key_size"], o["value_size"], dist, o.get("persist_mode"))


def main():
    ap = argparse.ArgumentParser(description="Turn pmbench --json results into PNG charts.")
    ap.add_argument("json", nargs="+", help="pmbench --json result files")
    ap.add_argument("-o", "--out-dir", help="output folder (default: the first file's folder)")
    ap.add_argument("--prefix", help="file name prefix (default: the first file's name without .json)")
    args = ap.parse_args()
    plt = _import_matplotlib()

    series, phases = load_series(args.json)
    if not series or not phases:
        sys.exit("pmbench-plot: no completed phases in the given results")
    out_dir = args.out_dir or os.path.dirname(os.path.abspath(args.json[0]))
    prefix = args.prefix or os.path.splitext(os.path.basename(args.json[0]))[0]
    os.makedirs(out_dir, exist_ok=True)
    sub = describe(args.json)
    written = []

    def path(kind):
        return os.path.join(out_dir, "%s-%s.png" % (prefix, kind))

    plot_throughput(plt, series, phases, "pmbench throughput\n" + sub, path("throughput"))
    written.append(path("throughput"))
    plot_timeline(plt, series, phases, "throughput over time (sampling windows) - " + sub, path("timeline"))
    written.append(path("timeline"))
    if plot_latency(plt, series, phases, "latency percentiles (sampled operations) - " + sub, path("latency")):
        written.append(path("latency"))
    if plot_pmcost(plt, series, phases, "PM cost per operation - " + sub, path("pmcost")):
        written.append(path("pmcost"))
    for w in written:
        print(w)


if __name__ == "__main__":
    main()
