"""zbatch itself, run like the peers: ``zbatch.DataLoader`` over a Zarr store.

Cells (anndata layout): ``sampler="block"`` with the peer's block size and a window of
``fetch_factor * batch_size`` rows (scDataset's fetch), or ``sampler="random"``; output CSR
(``scipy.sparse.csr_matrix``) or dense (the C ``densify`` transform, ``b["X_dense"]``).
Atoms (nvalchemi layout): ``sampler="random"`` (the peers shuffle), torch tensors out.

A CSR batch is counted by ``b["X"].shape[0]``: the scipy matrix is built (zbatch builds it on
first access), as every peer's consumer gets it. ``x_dtype`` / ``index_dtype`` are
``zbatch.open``'s (None: float32 / int32 for a narrow store; ``("stored", "int32")``: what
annbatch yields from it, uint8 values and int32 gene ids).

Cores: ``num_workers`` is zbatch's decode-thread count (``num_threads``), 2 here; the loader's
own pipeline thread does the gathering.
"""
from __future__ import annotations

import numpy as np

import zbatch

from . import measure, result


def _count(b) -> int:
    return len(b["index"])


def loader(data: str, batch_size: int, num_workers: int = 2, output: str = "csr", seed: int = 0,
           sampler: str = "block", block_size: int = 16, fetch_factor: int = 16,
           prefetch_factor: int = 16, cache_bytes: int = 0, x_dtype=None, index_dtype=None):
    ds = zbatch.open(data, num_threads=num_workers, cache_bytes=cache_bytes, x_dtype=x_dtype,
                     index_dtype=index_dtype)
    kw = {}
    transforms = []
    if ds.layout == "atomic":
        out = "torch"
    else:
        out = "scipy"
        if output == "dense":
            transforms = [("densify", None)]
    if sampler == "block":
        # scDataset's window (fetch_factor * batch_size rows) in blocks of block_size rows
        kw = {"block_size": block_size,
              "blocks_per_window": max(1, -(-fetch_factor * batch_size // block_size))}
    dl = zbatch.DataLoader(ds, batch_size=batch_size, sampler=sampler, seed=seed,
                           prefetch_factor=prefetch_factor, output=out, transforms=transforms,
                           **kw)
    config = {"tool": "zbatch", "sampler": sampler, "num_threads": num_workers,
              "prefetch_factor": prefetch_factor, "output": out,
              "transforms": [list(t) for t in transforms], "cache_bytes": cache_bytes,
              "x_dtype": x_dtype, "index_dtype": index_dtype, **kw}
    return ds, dl, config


def amplification(data: str, batch_size: int, sampler: str = "block", block_size: int = 16,
                  fetch_factor: int = 16, prefetch_factor: int = 16, windows: int = 2,
                  seed: int = 0, num_threads: int = 2) -> dict:
    """Read amplification (bytes decoded / bytes delivered) of the loader's coalesced reads:
    the sampler's first ``windows`` windows of ``prefetch_factor`` batches, each read with one
    ``read_many`` (what the loader does per window), statistics summed."""
    from zbatch.samplers import make_sampler
    ds = zbatch.open(data, num_threads=num_threads)
    kw = {}
    if sampler == "block":
        kw = {"block_size": block_size,
              "blocks_per_window": max(1, -(-fetch_factor * batch_size // block_size))}
    sm = make_sampler(sampler, n=len(ds), batch_size=batch_size, seed=seed, **kw)
    batches = []
    for ids in sm:
        batches.append(np.asarray(ids, dtype=np.int64))
        if len(batches) >= windows * prefetch_factor:
            break
    tot = {"bytes_decoded": 0, "bytes_delivered": 0, "bytes_fetched": 0, "chunks_decoded": 0}
    for w in range(0, len(batches), prefetch_factor):
        st = ds.read_many(np.concatenate(batches[w:w + prefetch_factor])).stats
        for k in tot:
            tot[k] += int(st[k])
    tot["amplification"] = (tot["bytes_decoded"] / tot["bytes_delivered"]
                            if tot["bytes_delivered"] else 0.0)
    return tot


def run(data: str, batch_size: int, seconds: float, num_workers: int = 2, output: str = "csr",
        seed: int = 0, sampler: str = "block", block_size: int = 16, fetch_factor: int = 16,
        prefetch_factor: int = 16, cache_bytes: int = 0, label: str = "", x_dtype=None,
        index_dtype=None, **_ignored) -> dict:
    ds, dl, config = loader(data, batch_size, num_workers, output, seed, sampler, block_size,
                            fetch_factor, prefetch_factor, cache_bytes, x_dtype, index_dtype)
    dense = output == "dense" and ds.layout != "atomic"
    csr = output == "csr" and ds.layout != "atomic"
    kinds = set()
    stats_seen = []

    def epoch(e):
        dl.set_epoch(e)
        return dl

    def count(b):
        if len(stats_seen) < 4:
            stats_seen.append(int(b.stats["bytes_delivered"]))
        if dense:
            assert b["X_dense"].shape[0] == len(b["index"])
        if csr:  # the matrix a consumer gets, built as annbatch's and every peer's are
            x = b["X"]
            if len(kinds) < 2:
                kinds.add(f"{type(x).__module__}.{type(x).__name__} {x.dtype} "
                          f"{x.indices.dtype} {x.indptr.dtype}")
            return x.shape[0]
        return _count(b)

    m = measure(epoch, seconds, count)
    dl.close()
    amp = amplification(data, batch_size, sampler, block_size, fetch_factor, prefetch_factor,
                        seed=seed, num_threads=num_workers)
    m["amplification"] = amp["amplification"]
    m["read_stats"] = amp
    # the loader's batches carry no read statistics yet (all zero): said here, not hidden
    m["loader_batch_stats_zero"] = not any(stats_seen)
    m["batch_types"] = sorted(kinds)
    kind = "atoms" if ds.layout == "atomic" else output
    setting = f"{sampler}" + (f" bs={block_size} ff={fetch_factor}" if sampler == "block"
                              else "") + f" {kind}"
    if label:
        setting += f" [{label}]"
    config.update({"store": data, "batch_size": batch_size, "seed": seed})
    return result("zbatch", setting, m, config)


def read_ids(data: str, ids, output: str = "csr", **_ignored) -> dict:
    """zbatch's read of ``ids`` (in order): cells -> {"X": csr or dense}, atoms -> the collated
    graph as numpy arrays."""
    ds = zbatch.open(data, num_threads=2)
    b = ds.read_many(np.asarray(ids, dtype=np.int64))
    if ds.layout == "atomic":
        keys = ("positions", "atomic_numbers", "forces", "energy", "neighbor_list", "shifts",
                "cell", "pbc", "atoms_ptr", "edges_ptr", "batch_idx")
        return {k: np.array(b[k]) for k in keys if k in b}
    x = b["X"].copy()
    return {"X": x.toarray() if output == "dense" else x}
