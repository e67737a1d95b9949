"""nvalchemi-toolkit 0.2.0's own pipeline: ``AtomicDataZarrReader`` -> ``Dataset`` ->
``DataLoader``, on a store written by its own ``AtomicDataZarrWriter`` (the anchor system of
the atomic layout).

Configuration, as nvalchemi's documentation recommends:
- ``DataLoader(ds, batch_size=B, shuffle=True, prefetch_factor=16)``: the DataLoader recipe of
  nvalchemi's data-storage guide ("fuse 16 batches per read_many call"); the read window is
  ``batch_size * prefetch_factor`` samples, double-buffered on a background thread;
- ``Dataset(reader, device="cpu", num_workers=2, skip_validation=True)``: ``num_workers`` sizes
  the Dataset's prefetch thread pool (2 = this machine's cores); ``skip_validation`` is the
  documented fast path for stores written by ``AtomicDataZarrWriter`` (trusted);
- no CUDA streams (no GPU here); the writer's default config (no compression: nvalchemi's
  default for every array group).

``write_store`` builds that store from the structures of a zbatch atomic store, read back
through zbatch (``bench.peers.atoms_samples``).
"""
from __future__ import annotations

import warnings

import numpy as np

from . import atoms_samples, measure, result

PREFETCH_FACTOR = 16


def _atomic_data(s: dict):
    import torch
    from nvalchemi.data import AtomicData
    t = torch.from_numpy
    return AtomicData(positions=t(s["positions"]), atomic_numbers=t(s["atomic_numbers"]),
                      forces=t(s["forces"]), energy=t(s["energy"]),
                      neighbor_list=t(s["neighbor_list"]), shifts=t(s["shifts"]),
                      cell=t(s["cell"]), pbc=t(s["pbc"]))


def write_store(src: str, dst: str, config=None) -> int:
    """Writes the structures of the zbatch atomic store ``src`` into ``dst`` with nvalchemi's
    own ``AtomicDataZarrWriter`` (one ``write`` of the whole list). Returns the count."""
    from nvalchemi.data.datapipes import AtomicDataZarrWriter
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = [_atomic_data(s) for s in atoms_samples(src)]
        AtomicDataZarrWriter(dst, config=config).write(samples)
    return len(samples)


def _dataset(data: str, num_workers: int):
    from nvalchemi.data.datapipes import AtomicDataZarrReader, Dataset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Dataset(AtomicDataZarrReader(data), device="cpu", num_workers=num_workers,
                       skip_validation=True)


def run(data: str, batch_size: int, seconds: float, num_workers: int = 2, output: str = "graph",
        seed: int = 0, prefetch_factor: int = PREFETCH_FACTOR, **_ignored) -> dict:
    import torch
    from nvalchemi.data.datapipes import DataLoader
    torch.manual_seed(seed)  # the DataLoader's RandomSampler draws from torch's global RNG
    ds = _dataset(data, num_workers)
    dl = DataLoader(ds, batch_size=batch_size, shuffle=True, prefetch_factor=prefetch_factor,
                    use_streams=False)

    def epoch(_e):
        return iter(dl)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = measure(epoch, seconds, lambda b: b.num_graphs)
    ds.close()
    config = {"tool": "nvalchemi DataLoader", "store": data, "reader": "AtomicDataZarrReader",
              "dataset": {"device": "cpu", "num_workers": num_workers, "skip_validation": True},
              "dataloader": {"batch_size": batch_size, "shuffle": True,
                             "prefetch_factor": prefetch_factor, "use_streams": False},
              "seed": seed}
    return result("nvalchemi", f"shuffled pf={prefetch_factor} atoms [own store]", m, config)


def read_ids(data: str, ids, output: str = "graph", **_ignored) -> dict:
    """nvalchemi's ``Dataset.load_batches([ids])``: one collated Batch, as numpy arrays."""
    ds = _dataset(data, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = ds.load_batches([[int(i) for i in ids]])[0]
    out = {"ids": np.asarray(ids, dtype=np.int64)}
    for key in ("positions", "atomic_numbers", "forces", "energy", "neighbor_list", "shifts",
                "cell", "pbc"):
        out[key] = b[key].numpy()
    ds.close()
    return out
