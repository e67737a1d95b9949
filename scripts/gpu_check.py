"""The GPU checks of issue 22, run by scripts/gpu-check.sh on a machine with a CUDA GPU.

1. Device batches equal host batches bit for bit: CSR X (and X_dense scattered on the device
   against the C densify on the host), obs columns, graph batches with their pointer arrays,
   batch_idx and re-based neighbour lists.
2. Host-to-device bandwidth: torch's pinned copy (the cudaMemcpy peak of this machine, the
   best of several sizes) against a copy out of zbatch's page-locked window memory.
3. Overlap: the loader delivering to the GPU while a simulated training step runs on the
   consumer's stream, against the CPU-only loader's throughput (copies hidden: ratio near 1),
   and the host time per batch in the loop (no host synchronisation per batch).
4. Pinned batches under non_blocking copies: pin_memory=True, the GPU kept behind the host
   (torch.cuda._sleep queued before each batch's copies), ``.to("cuda", non_blocking=True)``
   of X's crow, col ids and values, the host batch dropped at once; the device copies must
   equal a host loader's batches bit for bit (the loader reuses a batch's page-locked memory
   only after the copies queued before its release ran). The same loop over the path without
   that fence (memory reused at the drop) is run as the control: its mismatches show the race
   the check guards against really happens on this machine.

Prints the figures; exit status 0, 1 on a mismatch or an error, 77 without a GPU. With $OUT
set the figures also go to $OUT/gpu-check.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def synth(cli: str, kind: str, n: int, path: str) -> None:
    subprocess.run([cli, "synth", "--kind", kind, "--n", str(n), "-o", path], check=True,
                   stdout=subprocess.DEVNULL)


def same_bytes(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.contiguous().numpy().tobytes() == b.contiguous().numpy().tobytes()


def compare(host_batch, dev_batch, torch) -> list[str]:
    """Keys whose device value differs from the host value (bit for bit)."""
    bad = [f"{k} (only on the device)" for k in dev_batch if k not in host_batch]
    for k in host_batch:
        if k not in dev_batch:
            bad.append(f"{k} (missing on the device)")
            continue
        h, d = host_batch[k], dev_batch[k]
        if not isinstance(h, torch.Tensor):
            if list(h) != list(d):
                bad.append(k)
            continue
        if not d.is_cuda:
            bad.append(f"{k} (not on the device)")
            continue
        if h.layout == torch.sparse_csr:
            ok = same_bytes(h.crow_indices(), d.crow_indices().cpu()) and \
                same_bytes(h.col_indices(), d.col_indices().cpu()) and \
                same_bytes(h.values(), d.values().cpu())
        else:
            ok = same_bytes(h, d.cpu())
        if not ok:
            bad.append(k)
    return bad


def check_equal(ds, torch, zbatch, batch_size: int, densify: bool) -> tuple[int, list[str]]:
    kw = dict(batch_size=batch_size, shuffle=True, seed=3, output="torch")
    host = zbatch.DataLoader(ds, densify="host" if densify else None, **kw)
    dev = zbatch.DataLoader(ds, device="cuda", densify="device" if densify else None, **kw)
    n, bad = 0, []
    for hb, db in zip(host, dev):
        if dev.placement != "device":
            return n, [f"the loader fell back to host memory: {dev.placement_reason}"]
        bad += [f"batch {n}: {k}" for k in compare(hb, db, torch)]
        n += 1
    if n != len(host):
        bad.append(f"{n} batches compared, {len(host)} expected")
    return n, bad


def copy_rate(torch, src, reps: int = 20) -> float:
    dst = torch.empty_like(src, device="cuda")
    dst.copy_(src, non_blocking=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    return src.numel() * src.element_size() * reps / (start.elapsed_time(end) / 1e3) / 1e9


def bandwidth(ds, torch, zbatch, batch_size: int) -> dict:
    peak = 0.0
    for mb in (16, 64, 256):
        t = torch.empty(mb << 20, dtype=torch.uint8, pin_memory=True)
        peak = max(peak, copy_rate(torch, t, 10))
    pageable = copy_rate(torch, torch.empty(64 << 20, dtype=torch.uint8), 5)
    dl = zbatch.DataLoader(ds, batch_size=batch_size, pin_memory=True, output="torch")
    b = next(iter(dl))
    vals = b["X"].values()
    same = torch.empty(vals.numel() * vals.element_size(), dtype=torch.uint8, pin_memory=True)
    out = {"peak_pinned_GBps": peak, "pageable_GBps": pageable,
           "zbatch_arena_pinned": bool(vals.is_pinned()), "placement": dl.placement,
           "zbatch_arena_GBps": copy_rate(torch, vals), "batch_bytes": same.numel(),
           "torch_pinned_same_size_GBps": copy_rate(torch, same)}
    out["arena_vs_peak"] = out["zbatch_arena_GBps"] / peak
    return out


def epoch_rate(loader, step=None, passes: int = 3) -> tuple[float, float]:
    """(samples/s over `passes` epochs after a warm-up epoch, host seconds per batch spent
    waiting in the loop for the next batch)."""
    import torch
    for b in loader:   # warm-up: pools, caches, streams
        if step:
            step(b)
    torch.cuda.synchronize()
    n, nb, waited, t0 = 0, 0, 0.0, time.perf_counter()
    for _ in range(passes):
        it = iter(loader)
        while True:
            w = time.perf_counter()
            b = next(it, None)
            waited += time.perf_counter() - w
            if b is None:
                break
            n += len(b["index"])
            nb += 1
            if step:
                step(b)
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0), waited / max(1, nb)


def sleep_cycles(torch, ms: float) -> int:
    """The torch.cuda._sleep argument that keeps the GPU busy for about `ms` milliseconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * ms / start.elapsed_time(end))


def pinned_non_blocking(path: str, torch, zbatch, batch_size: int = 128,
                        nbatches: int = 100) -> dict:
    """Check 4: the first `nbatches` batches of a pin_memory=True loader, each copied with
    non_blocking=True behind queued GPU work (4x the host loader's time per batch, 5-40 ms, so
    the GPU falls ever further behind), against a host loader's."""
    ds = zbatch.open(path, index_dtype="int64")   # the col ids, too, in the page-locked window
    kw = dict(batch_size=batch_size, shuffle=True, seed=11, output="torch", prefetch_factor=2)

    def parts(b):
        x = b["X"]
        return x.crow_indices(), x.col_indices(), x.values()

    t0 = time.perf_counter()
    want = [tuple(t.clone() for t in parts(b))
            for _, b in zip(range(nbatches), zbatch.DataLoader(ds, **kw))]
    sleep_ms = min(40.0, max(5.0, 4e3 * (time.perf_counter() - t0) / max(1, len(want))))
    cycles = sleep_cycles(torch, sleep_ms)

    def run(dl) -> dict:
        got, ours, it = [], 0, iter(dl)
        t0 = time.perf_counter()
        for _ in range(nbatches):
            b = next(it, None)
            if b is None:
                break
            torch.cuda._sleep(cycles)   # the model's work queued ahead: the GPU lags the host
            # crow (malloc'd pointer arrays) goes through torch's own pinned memory: a copy
            # from pageable memory may wait for the stream, which would let the GPU catch up
            host = parts(b)
            ours += sum(t.is_pinned() for t in host)
            host = [t if t.is_pinned() else t.pin_memory() for t in host]
            got.append(tuple(t.to("cuda", non_blocking=True) for t in host))
            del b, host                 # only the device copies are kept
        host_s = time.perf_counter() - t0
        stats = dl._live.device_stats() if dl._live is not None else None
        torch.cuda.synchronize()
        bad = [i for i, (w, g) in enumerate(zip(want, got))
               if not all(same_bytes(h, d.cpu()) for h, d in zip(w, g))]
        placement = dl.placement
        it.close()
        dl.close()
        return {"batches": len(got), "mismatched_batches": len(bad), "first_mismatches": bad[:5],
                "parts_in_zbatch_pinned_memory": ours, "placement": placement,
                "host_loop_s": host_s,
                "device_stats": stats}

    fenced = run(zbatch.DataLoader(ds, pin_memory=True, **kw))
    control = zbatch.DataLoader(ds, pin_memory=True, **kw)
    control._take = lambda loader: loader.next   # the old path: memory reused at the drop
    unfenced = run(control)
    return {"batch_size": batch_size, "sleep_ms_per_batch": sleep_ms,
            "reference_batches": len(want), "fenced": fenced, "control_unfenced": unfenced}


def report_pinned(pn: dict) -> list[str]:
    """Prints check 4's figures; returns its failures."""
    bad = []
    fenced, ctl = pn["fenced"], pn["control_unfenced"]
    print(f"gpu-check: pinned batches + non_blocking copies behind "
          f"{pn['sleep_ms_per_batch']:.0f} ms of GPU work each: {fenced['batches']} batches, "
          f"{fenced['mismatched_batches']} mismatched "
          f"({'OK' if not fenced['mismatched_batches'] else 'MISMATCH'}; "
          f"{fenced['parts_in_zbatch_pinned_memory']} copies out of zbatch's pinned memory, "
          f"releases with the stream's work pending: "
          f"{(fenced['device_stats'] or {}).get('retired_pending')}, page-locked blocks "
          f"{(fenced['device_stats'] or {}).get('host_blocks')}, host loop "
          f"{fenced['host_loop_s']:.2f} s) | control without the fence: "
          f"{ctl['mismatched_batches']} of {ctl['batches']} mismatched"
          f"{'' if ctl['mismatched_batches'] else ' (the race did not show here)'}")
    if fenced["placement"] != "pinned":
        bad.append(f"pinned check fell back to {fenced['placement']}")
    elif not fenced["parts_in_zbatch_pinned_memory"]:
        bad.append("pinned check: no copy came out of zbatch's page-locked memory")
    if fenced["mismatched_batches"] or fenced["batches"] != pn["reference_batches"]:
        bad.append(f"pinned non_blocking copies: {fenced['mismatched_batches']} of "
                   f"{fenced['batches']} batches differ from the host loader's "
                   f"(first: {fenced['first_mismatches']})")
    return bad


def overlap(ds, torch, zbatch, batch_size: int, threads: int, rounds: int = 3) -> dict:
    """The three loops, interleaved `rounds` times (the medians are reported: a shared machine's
    neighbours and warm-up move single epochs): the CPU-only loader; the loader delivering to the
    GPU while a training step runs on the consumer's stream; the CPU loader plus torch's
    ``.to("cuda")`` per batch before the same step."""
    kw = dict(batch_size=batch_size, shuffle=True, seed=5, output="torch", num_threads=threads)
    cpu_rate, _ = epoch_rate(zbatch.DataLoader(ds, **kw))
    per_batch = batch_size / cpu_rate
    # a training step of half the loader's time per batch, on the consumer's stream, that
    # reads the batch: the loader must keep up with it with the copies hidden
    cycles = sleep_cycles(torch, 0.5 * per_batch * 1e3)

    def step(b):
        b["X"].values().sum()
        torch.cuda._sleep(cycles)

    def torch_copy_step(b):
        step({"X": b["X"].to("cuda", non_blocking=True)})

    dev = zbatch.DataLoader(ds, device="cuda", **kw)
    cpu, gpu, old, waits = [], [], [], []
    for _ in range(rounds):
        cpu.append(epoch_rate(zbatch.DataLoader(ds, **kw))[0])
        rate, waited = epoch_rate(dev, step)
        gpu.append(rate)
        waits.append(waited)
        old.append(epoch_rate(zbatch.DataLoader(ds, pin_memory=True, **kw), torch_copy_step)[0])
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    # torch's own account of host synchronisations in the loop (zbatch's C side makes none:
    # tests/c/test_cuda.c counts them with a fake runtime); its mode is a prototype and says
    # so in a warning of its own, which is not a synchronisation
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for b in dev:
                step(b)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message).splitlines()[0] for w in caught
             if "synchroniz" in str(w.message).lower() and "prototype" not in str(w.message)]
    return {"threads": threads, "rounds": rounds,
            "cpu_loader_samples_per_s": med(cpu), "gpu_loader_with_step_samples_per_s": med(gpu),
            "overlap_ratio": med(gpu) / med(cpu), "step_ms": 0.5 * per_batch * 1e3,
            "host_wait_ms_per_batch": med(waits) * 1e3,
            "torch_syncs_per_epoch": len(syncs), "torch_sync_examples": syncs[:3],
            "torch_to_per_batch_with_step_samples_per_s": med(old),
            "all_rounds": {"cpu": cpu, "gpu": gpu, "torch_to": old},
            "placement": dev.placement, "device_stats": dev._live.device_stats()
            if dev._live is not None else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", required=True, help="the zbatch command (for synth)")
    ap.add_argument("--cells", type=int, default=100000)
    ap.add_argument("--atoms", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1),
                    help="decode threads of the loaders in the overlap runs")
    args = ap.parse_args()
    import torch
    import zbatch
    from zbatch import _zbatch
    from zbatch._cuda import loaded_cudart, torch_cuda_problem
    if not torch.cuda.is_available():
        print(f"gpu-check: no GPU here: {torch_cuda_problem('cuda')}. Nothing measured.")
        return 77
    torch.cuda.init()
    torch.zeros(1, device="cuda")   # torch's runtime is loaded: zbatch uses the same one
    runtime = loaded_cudart()
    print(f"gpu-check: {torch.cuda.get_device_name()} | torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}) | runtime {runtime or '(none loaded: dlopen default)'}")
    why = _zbatch.cuda_probe(runtime, torch.cuda.current_device())
    if why:
        print(f"gpu-check: FAIL: zbatch cannot use the CUDA runtime: {why}")
        return 1
    figures: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        cells, atoms = os.path.join(tmp, "cells.zarr"), os.path.join(tmp, "atoms.zarr")
        t0 = time.perf_counter()
        synth(args.cli, "cells", args.cells, cells)
        synth(args.cli, "atoms", args.atoms, atoms)
        print(f"gpu-check: stores written in {time.perf_counter() - t0:.1f} s "
              f"({args.cells} cells, {args.atoms} structures)")
        dc, da = zbatch.open(cells), zbatch.open(atoms)
        n1, bad1 = check_equal(dc, torch, zbatch, args.batch_size, densify=True)
        n2, bad2 = check_equal(da, torch, zbatch, 64, densify=False)
        figures["equal"] = {"cell_batches": n1, "graph_batches": n2, "mismatches": bad1 + bad2}
        print(f"gpu-check: device == host bit for bit: {n1} cell batches (CSR X, X_dense, obs), "
              f"{n2} graph batches: {'OK' if not bad1 + bad2 else 'MISMATCH'}")
        for m in (bad1 + bad2)[:20]:
            print(f"  mismatch: {m}")
        failed += bad1 + bad2
        pn = pinned_non_blocking(cells, torch, zbatch)
        figures["pinned_non_blocking"] = pn
        failed += report_pinned(pn)
        bw = bandwidth(dc, torch, zbatch, args.batch_size)
        figures["bandwidth"] = bw
        print(f"gpu-check: H2D peak (torch pinned, best of 16-256 MB) {bw['peak_pinned_GBps']:.1f} "
              f"GB/s | pageable {bw['pageable_GBps']:.1f} GB/s | zbatch window memory "
              f"(pinned: {bw['zbatch_arena_pinned']}) {bw['zbatch_arena_GBps']:.1f} GB/s for "
              f"{bw['batch_bytes'] >> 10} KiB vs torch pinned same size "
              f"{bw['torch_pinned_same_size_GBps']:.1f} GB/s: {bw['arena_vs_peak']:.2f} x peak "
              f"(target >= 0.8)")
        if not bw["zbatch_arena_pinned"]:
            failed.append("the pin_memory loader's batches are not page-locked")
        ov = overlap(dc, torch, zbatch, args.batch_size, args.threads)
        figures["overlap"] = ov
        print(f"gpu-check: ({ov['threads']} threads, median of {ov['rounds']} interleaved rounds) "
              f"CPU-only loader {ov['cpu_loader_samples_per_s']:.0f} cells/s | to GPU "
              f"with a {ov['step_ms']:.1f} ms step {ov['gpu_loader_with_step_samples_per_s']:.0f} "
              f"cells/s: overlap {ov['overlap_ratio']:.2f} (target >= 0.9) | host wait "
              f"{ov['host_wait_ms_per_batch']:.2f} ms/batch, torch syncs per epoch "
              f"{ov['torch_syncs_per_epoch']} | pinned loader + torch .to() per batch "
              f"{ov['torch_to_per_batch_with_step_samples_per_s']:.0f} cells/s")
        if ov["placement"] != "device":
            failed.append(f"overlap run fell back to {ov['placement']}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu-check.json"), "w") as f:
            json.dump(figures, f, indent=1, default=str)
    print(f"gpu-check: {'FAIL' if failed else 'PASS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
