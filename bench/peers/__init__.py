"""Peer loaders for the side-by-side benchmark (bench/run.py).

Every peer module exposes

    run(data, batch_size, seconds, num_workers=2, output="csr", seed=0, **opts) -> dict
    read_ids(data, ids, output="csr", **opts) -> dict      # the same content for chosen ids

``data`` is the path of the store the peer reads (an h5ad file, a Zarr store, an LMDB file).
``run`` iterates the peer's own loader, configured as its documentation recommends, for
``seconds`` of steady state (epochs restart when the data runs out) and returns

    {"loader", "setting", "samples_per_s", "batches", "samples", "seconds", "startup_s",
     "minflt_per_batch", "config"}

``samples_per_s`` counts from the first batch on (``startup_s``: opening the loader, starting
its workers and producing the first batch, reported apart). ``read_ids`` goes through the same
reading machinery for an explicit id list, so bench/run.py and the tests can check that every
peer delivers the same values as zbatch. The cores given to each tool are two (this machine's),
as ``num_workers`` DataLoader processes or threads, whichever the tool offers; each module says
which.
"""
from __future__ import annotations

import resource
import time
from typing import Any, Callable, Iterable, Iterator

import numpy as np

__all__ = ["measure", "csr_rows", "result", "concat_graphs", "atoms_samples", "ATOM_KEYS"]


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure(make_epoch: Callable[[int], Iterable], seconds: float,
            count: Callable[[Any], int]) -> dict:
    """Iterates ``make_epoch(epoch)`` (a fresh iterable per epoch) until ``seconds`` have passed
    after the first batch. Returns samples, batches, the measured window, the startup time (up to
    the first batch) and the page faults of this process per batch."""
    t0 = time.perf_counter()
    epoch = 0
    samples = batches = 0
    t_first = None
    f_first = 0
    deadline = None
    while True:
        it: Iterator = iter(make_epoch(epoch))
        got_any = False
        try:
            for b in it:
                got_any = True
                n = int(count(b))
                now = time.perf_counter()
                if t_first is None:  # the first batch only ends the startup
                    t_first, f_first = now, _minflt()
                    deadline = t_first + seconds
                    continue
                samples += n
                batches += 1
                if now >= deadline:
                    break
        finally:
            close = getattr(it, "close", None) or getattr(it, "_shutdown_workers", None)
            if close is not None:
                try:
                    close()
                except Exception:
                    pass
            del it
        if not got_any:
            raise RuntimeError("the loader produced no batch")
        if deadline is not None and time.perf_counter() >= deadline:
            break
        epoch += 1
    t_end = time.perf_counter()
    window = t_end - t_first
    return {
        "samples": samples,
        "batches": batches,
        "seconds": window,
        "startup_s": t_first - t0,
        "samples_per_s": samples / window if window > 0 else 0.0,
        "epochs_started": epoch + 1,
        "minflt_per_batch": (_minflt() - f_first) / batches if batches else 0.0,
    }


def result(loader: str, setting: str, m: dict, config: dict) -> dict:
    out = {"loader": loader, "setting": setting}
    out.update(m)
    out["config"] = config
    return out


def csr_rows(x) -> int:
    """Rows of a batch matrix (scipy sparse, numpy, torch dense or sparse CSR)."""
    return int(x.shape[0])


def concat_graphs(samples: list[dict]) -> dict:
    """Collates per-sample atomic dicts (numpy arrays, neighbour lists local to the sample) the
    way nvalchemi's Batch and zbatch do: per-atom and per-edge fields concatenated, neighbour
    lists offset by the running atom count, system fields stacked, cumulative pointers."""
    nat = np.array([len(s["positions"]) for s in samples], dtype=np.int64)
    ned = np.array([len(s["neighbor_list"]) for s in samples], dtype=np.int64)
    atoms_ptr = np.zeros(len(samples) + 1, dtype=np.int64)
    edges_ptr = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum(nat, out=atoms_ptr[1:])
    np.cumsum(ned, out=edges_ptr[1:])
    out = {}
    for key in samples[0]:
        parts = [s[key] for s in samples]
        if key == "neighbor_list":
            parts = [p + atoms_ptr[k] for k, p in enumerate(parts)]
        out[key] = np.concatenate(parts)
    out["atoms_ptr"] = atoms_ptr
    out["edges_ptr"] = edges_ptr
    out["batch_idx"] = np.repeat(np.arange(len(samples), dtype=np.int64), nat)
    return out


ATOM_KEYS = ("positions", "atomic_numbers", "forces", "energy", "neighbor_list", "shifts",
             "cell", "pbc")


def atoms_samples(path: str, chunk: int = 256):
    """Per-sample dicts of numpy arrays (neighbour lists local to the sample) read back from an
    atomic store through zbatch, in store order: the structures the atomistic peers' stores are
    written from."""
    import zbatch
    ds = zbatch.open(path, num_threads=2)
    n = len(ds)
    for lo in range(0, n, chunk):
        b = ds.read_many(np.arange(lo, min(n, lo + chunk)))
        ap, ep = np.asarray(b["atoms_ptr"]), np.asarray(b["edges_ptr"])
        for k in range(len(ap) - 1):
            a0, a1, e0, e1 = ap[k], ap[k + 1], ep[k], ep[k + 1]
            s = {}
            for key in ATOM_KEYS:
                if key not in b:
                    continue
                v = np.asarray(b[key])
                if key in ("positions", "atomic_numbers", "forces"):
                    s[key] = v[a0:a1].copy()
                elif key in ("neighbor_list", "shifts"):
                    s[key] = v[e0:e1].copy()
                else:
                    s[key] = v[k:k + 1].copy()
            s["neighbor_list"] = s["neighbor_list"] - a0
            yield s
