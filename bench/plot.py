"""Plots of the records bench/run.py writes: PNGs with matplotlib (Agg).

    .venv/bin/python bench/plot.py [--results DIR] [--out DIR] [--record FILE]

- ``peers-throughput.png``: samples/s per loader and setting (the latest full record, else the
  latest quick one, or ``--record``), one panel for cells and one for atoms, log scale, each peer
  bar labelled with zbatch's ratio over it (a bar chart in the manner of annbatch's Figure 1);
- ``peers-threads.png``: samples/s against threads, for every loader/setting measured at several
  thread counts (across all records of the results directory); only when such records exist;
- ``peers-amplification.png``: zbatch's read amplification (bytes decoded / delivered) against
  block size, per store and read window, random sampling as dashed lines, and zbatch's samples/s
  when measured; only when the record has the sweep.

Writes into ``--out`` (default ``results/plots``) and prints the paths.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ZB_COLOR = "#1f6f3f"
PEER_COLORS = {"scDataset": "#3b6ea8", "AnnLoader": "#8a5aa8", "zarrs": "#c77a1e",
               "nvalchemi": "#76b900", "LMDB": "#a8433b"}


def load_records(results: Path) -> list[tuple[Path, dict]]:
    out = []
    for p in sorted(results.glob("*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and "entries" in rec:
            out.append((p, rec))
    return out


def pick(records: list[tuple[Path, dict]]) -> tuple[Path, dict]:
    full = [r for r in records if not r[1].get("parameters", {}).get("quick")]
    pool = full or records
    return max(pool, key=lambda r: (r[1].get("created", ""), r[0].name))


def _label(e: dict) -> str:
    return f"{e.get('loader', '?')}: {e.get('setting', e.get('id'))}"


def plot_throughput(rec: dict, out: Path, plt) -> Path:
    entries = [e for e in rec["entries"] if e.get("samples_per_s", 0) > 0]
    main_t = rec.get("parameters", {}).get("threads", [2])[0]
    entries = [e for e in entries if e.get("threads", main_t) == main_t]
    panels = [("cells", "cells / s"), ("atoms", "structures / s")]
    heights = [max(1, sum(1 for e in entries if e["group"].startswith(g))) for g, _ in panels]
    fig, axes = plt.subplots(2, 1, figsize=(11, 0.42 * sum(heights) + 2.6),
                             gridspec_kw={"height_ratios": heights})
    for ax, (group, unit) in zip(axes, panels):
        rows = [e for e in entries if e["group"].startswith(group)]
        rows.sort(key=lambda e: e["samples_per_s"])
        if not rows:
            ax.set_visible(False)
            continue
        y = range(len(rows))
        colors = [ZB_COLOR if e.get("loader") == "zbatch"
                  else PEER_COLORS.get(e.get("loader"), "#777777") for e in rows]
        ax.barh(list(y), [e["samples_per_s"] for e in rows], color=colors)
        ax.set_yticks(list(y))
        ax.set_yticklabels([_label(e) for e in rows], fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel(f"{unit} (log scale)")
        for k, e in enumerate(rows):
            txt = f" {e['samples_per_s']:,.0f}"
            r = e.get("ratio_zbatch_over_peer")
            if r:
                txt += f"   zbatch {r:.1f}x"
            ax.text(e["samples_per_s"], k, txt, va="center", fontsize=7)
        lo = min(e["samples_per_s"] for e in rows)
        hi = max(e["samples_per_s"] for e in rows)
        ax.set_xlim(lo / 2, hi * 8)
        ax.set_title(f"{group}: same data, same batch size, {main_t} cores", fontsize=10)
        ax.grid(axis="x", which="both", alpha=0.25)
    m = rec.get("machine", {})
    p = rec.get("parameters", {})
    fig.suptitle(f"zbatch and peer loaders — {p.get('cells')} cells, {p.get('atoms')} "
                 f"structures, batch {p.get('batch_size')}/{p.get('atoms_batch_size')}, "
                 f"{p.get('seconds')} s each\n{m.get('cpu_model', '')}, "
                 f"{m.get('usable_cores')} cores, {m.get('memory_gib')} GiB", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # room for the two-line title above the panels
    path = out / "peers-throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_threads(records: list[tuple[Path, dict]], out: Path, plt):
    series = defaultdict(dict)  # (loader, setting) -> threads -> (created, samples/s)
    for _p, rec in records:
        for e in rec["entries"]:
            if e.get("samples_per_s", 0) <= 0 or "threads" not in e:
                continue
            key = (e.get("loader"), e.get("setting"))
            prev = series[key].get(e["threads"])
            if prev is None or rec.get("created", "") >= prev[0]:
                series[key][e["threads"]] = (rec.get("created", ""), e["samples_per_s"])
    multi = {k: v for k, v in series.items() if len(v) >= 2}
    if not multi:
        return None
    fig, ax = plt.subplots(figsize=(12, 5.5))
    cmap = plt.get_cmap("tab20")
    for k, ((loader, setting), pts) in enumerate(sorted(multi.items())):
        ts = sorted(pts)
        ax.plot(ts, [pts[t][1] for t in ts], "-" if loader == "zbatch" else "--",
                marker="o" if loader == "zbatch" else "s", color=cmap(k % 20),
                lw=2 if loader == "zbatch" else 1.3, label=f"{loader}: {setting}")
    ax.set_xlabel("threads / worker processes")
    ax.set_ylabel("samples / s (log scale)")
    ax.set_yscale("log")
    ax.set_xticks(sorted({t for v in multi.values() for t in v}))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("throughput against threads (solid: zbatch, dashed: peers)")
    fig.tight_layout()
    path = out / "peers-threads.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_amplification(rec: dict, out: Path, plt):
    sweep = rec.get("amplification_sweep") or []
    if not sweep:
        return None
    has_speed = any("samples_per_s" in r for r in sweep)
    fig, axes = plt.subplots(1, 2 if has_speed else 1, figsize=(12 if has_speed else 7, 4.8),
                             squeeze=False)
    groups = defaultdict(list)
    for r in sweep:
        groups[(r["store"], r.get("window", ""))].append(r)
    palette = ["#1f6f3f", "#3b6ea8", "#c77a1e", "#a8433b", "#8a5aa8", "#555555"]
    for k, ((store, window), rows) in enumerate(sorted(groups.items())):
        color = palette[k % len(palette)]
        blk = sorted((r for r in rows if r["block_size"]), key=lambda r: r["block_size"])
        rnd = [r for r in rows if not r["block_size"]]
        label = f"{store}, window {window}"
        for col, field, ylabel in ((0, "amplification", "bytes decoded / bytes delivered"),
                                   (1, "samples_per_s", "zbatch cells / s (CSR)")):
            if col == 1 and not has_speed:
                continue
            ax = axes[0][col]
            xs = [r["block_size"] for r in blk if field in r]
            ax.plot(xs, [r[field] for r in blk if field in r], marker="o", color=color,
                    label=label)
            for r in rnd:
                if field in r:
                    ax.axhline(r[field], color=color, ls="--", lw=1, alpha=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("block size (rows)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, which="both")
    axes[0][0].set_title("read amplification (dashed: random sampling)", fontsize=10)
    if has_speed:
        axes[0][1].set_title("zbatch throughput (dashed: random sampling)", fontsize=10)
    axes[0][0].legend(fontsize=7)
    p = rec.get("parameters", {})
    fig.suptitle(f"block sampling: {p.get('cells')} cells, batch {p.get('batch_size')}",
                 fontsize=10)
    fig.tight_layout()
    path = out / "peers-amplification.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--out", default=None, help="default: RESULTS/plots")
    ap.add_argument("--record", default=None, help="the record for the bar chart")
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    results = Path(args.results)
    records = load_records(results)
    if args.record:
        rp = Path(args.record)
        chosen = (rp, json.loads(rp.read_text()))
        if all(p != rp for p, _ in records):
            records.append(chosen)
    elif records:
        chosen = pick(records)
    else:
        print(f"no records in {results}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else results / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = [plot_throughput(chosen[1], out, plt), plot_threads(records, out, plt),
               plot_amplification(chosen[1], out, plt)]
    print(f"record: {chosen[0]}")
    for w in written:
        if w:
            print(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
