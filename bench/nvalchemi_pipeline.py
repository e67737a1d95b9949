"""nvalchemi's "Putting it all together" pipeline, in nvalchemi and in zbatch, on the same store.

nvalchemi-toolkit 0.2.0, as its data-loading guide writes it (no GPU here: device="cpu",
use_streams=False, pin_memory=False)::

    reader = AtomicDataZarrReader(store)
    dataset = Dataset(reader=reader, device="cpu", num_workers=1, skip_validation=True)
    sampler = SizeAwareSampler(dataset=dataset, max_atoms=4096)
    loader = DataLoader(dataset=dataset, batch_size=64, sampler=sampler, prefetch_factor=16,
                        use_streams=False)

zbatch, the same pipeline with real ``nvalchemi.data.Batch`` objects out::

    ds = zbatch.open(store, num_threads=2)
    sampler = zbatch.samplers.SizeAwareSampler(ds, max_atoms=4096, max_batch_size=64)
    loader = zbatch.DataLoader(ds, sampler=sampler, prefetch_factor=16, output="nvalchemi")

Both iterate for ``--seconds`` per round (epochs restart), rounds alternating between the two
tools in one process, and count ``batch.num_graphs`` (structures/s). The store is ``zbatch
synth --kind atoms`` (10-200 atoms per structure, neighbour lists at 5 Å); ``--nvalchemi-store``
adds a round on a copy written by nvalchemi's own ``AtomicDataZarrWriter``
(``--only-nvalchemi-store``: that copy alone). zbatch's side takes ``--cache-gib`` (the
decoded-chunk cache) and ``--block-size K --window-size W`` (chunk-aware size-aware packing,
with the loader's own window for it).

    PYTHONPATH=python .venv/bin/python bench/nvalchemi_pipeline.py --n 20000 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.peers import measure  # noqa: E402

MAX_ATOMS = 4096
BATCH_SIZE = 64
PREFETCH_FACTOR = 16


def _cli() -> str:
    for p in (REPO / "build" / "zbatch", Path(os.environ.get("ZBATCH_CLI", "/nonexistent"))):
        if p.exists():
            return str(p)
    raise SystemExit("the zbatch CLI is not built (build/zbatch); set ZBATCH_CLI")


def make_store(path: Path, n: int, seed: int) -> None:
    if not path.exists():
        subprocess.run([_cli(), "synth", "--kind", "atoms", "--n", str(n), "-o", str(path),
                        "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)


def nvalchemi_loader(store: str):
    from nvalchemi.data.datapipes import AtomicDataZarrReader, DataLoader, Dataset
    from nvalchemi.dynamics import SizeAwareSampler
    reader = AtomicDataZarrReader(store)
    dataset = Dataset(reader=reader, device="cpu", num_workers=1, skip_validation=True)
    sampler = SizeAwareSampler(dataset=dataset, max_atoms=MAX_ATOMS)
    return DataLoader(dataset=dataset, batch_size=BATCH_SIZE, sampler=sampler,
                      prefetch_factor=PREFETCH_FACTOR, use_streams=False)


def zbatch_loader(store: str, threads: int, cache_bytes: "int | str" = 0, block_size: int = 0,
                  window_size: int = 8192):
    """zbatch's pipeline; with block_size, chunk-aware packing (windows of window_size
    structures in blocks of block_size) and the loader's own window for it."""
    import zbatch
    ds = zbatch.open(store, num_threads=threads, cache_bytes=cache_bytes)
    if cache_bytes == "auto":
        print(f"cache_bytes='auto': {ds.cache_bytes / 2**20:,.0f} MiB (decoded store "
              f"{ds.decoded_bytes / 2**20:,.0f} MiB)", flush=True)
    sampler = zbatch.samplers.SizeAwareSampler(ds, max_atoms=MAX_ATOMS,
                                               max_batch_size=BATCH_SIZE,
                                               block_size=block_size or None,
                                               window_size=window_size)
    return zbatch.DataLoader(ds, sampler=sampler,
                             prefetch_factor=None if block_size else PREFETCH_FACTOR,
                             output="nvalchemi")


def run(loader, seconds: float) -> dict:
    from nvalchemi.data import Batch
    seen = {}

    def count(b):
        if "type" not in seen:
            seen["type"] = type(b)
            assert isinstance(b, Batch), type(b)
        return b.num_graphs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return measure(lambda _e: iter(loader), seconds, count)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="structures in the store")
    ap.add_argument("--dir", default="/tmp/zbatch-nvpipeline", help="where the stores live")
    ap.add_argument("--seconds", type=float, default=8.0, help="steady-state seconds per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="zbatch decode threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-gib", type=float, default=0.0,
                    help="zbatch's decoded-chunk cache (cache_bytes), GiB")
    ap.add_argument("--cache", choices=["auto"], default=None,
                    help="zbatch: cache_bytes='auto' (sized from the store; overrides --cache-gib)")
    ap.add_argument("--nvalchemi-store", action="store_true",
                    help="also run both on a copy written by nvalchemi's AtomicDataZarrWriter")
    ap.add_argument("--only", choices=["zbatch", "nvalchemi"], default=None,
                    help="run one tool (for profiling)")
    ap.add_argument("--only-nvalchemi-store", action="store_true",
                    help="with --nvalchemi-store: skip the zbatch synth store")
    ap.add_argument("--block-size", type=int, default=0,
                    help="zbatch: chunk-aware size-aware packing in blocks of K structures")
    ap.add_argument("--window-size", type=int, default=8192,
                    help="zbatch: structures packed together (size-aware window_size)")
    args = ap.parse_args(argv)

    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    stores = {"zbatch synth": base / f"atoms-{args.n}-{args.seed}.zarr"}
    make_store(stores["zbatch synth"], args.n, args.seed)
    if args.nvalchemi_store:
        own = base / f"atoms-{args.n}-{args.seed}-nvalchemi.zarr"
        if not own.exists():
            from bench.peers.nvalchemi_peer import write_store
            write_store(str(stores["zbatch synth"]), str(own))
        stores["nvalchemi's writer"] = own
        if args.only_nvalchemi_store:
            del stores["zbatch synth"]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, store in stores.items():
            tools = {"nvalchemi": lambda s=str(store): nvalchemi_loader(s),
                     "zbatch": lambda s=str(store): zbatch_loader(
                         s, args.threads, args.cache or int(args.cache_gib * 2**30),
                         args.block_size,
                         args.window_size)}
            if args.only:
                tools = {args.only: tools[args.only]}
            loaders = {name: make() for name, make in tools.items()}
            rates: dict[str, list[float]] = {name: [] for name in loaders}
            for r in range(args.rounds):
                for name, loader in loaders.items():
                    m = run(loader, args.seconds)
                    rates[name].append(m["samples_per_s"])
                    print(f"[{label}] round {r + 1} {name:9s} {m['samples_per_s']:10,.0f} "
                          f"structures/s ({m['batches']} batches, "
                          f"{m['samples'] / max(m['batches'], 1):.1f} structures/batch)",
                          flush=True)
            med = {name: statistics.median(v) for name, v in rates.items()}
            line = ", ".join(f"{name} {v:,.0f}" for name, v in med.items())
            if len(med) == 2:
                line += f"; ratio {med['zbatch'] / med['nvalchemi']:.1f}x"
            print(f"[{label}] median structures/s: {line}", flush=True)


if __name__ == "__main__":
    main()
