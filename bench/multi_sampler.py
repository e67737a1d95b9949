"""Multi-dataset samplers, zbatch against nvalchemi-toolkit (docs/SAMPLERS.md, "Multi-dataset"):
ids per second over one epoch of three children (600k, 300k, 100k samples), batch 256, for
MultiDatasetBatchSampler and MultiDatasetSampler, with and without replacement.

    PYTHONPATH=python .venv/bin/python bench/multi_sampler.py
"""
from __future__ import annotations

import time

from nvalchemi.data.datapipes.multidataset import MultiDataset
from nvalchemi.data.datapipes.samplers import MultiDatasetBatchSampler, MultiDatasetSampler

import zbatch

SIZES = [600_000, 300_000, 100_000]


class _Child:
    """A child of a given length: what nvalchemi's MultiDataset requires (its samplers only
    call len)."""

    field_names = ("positions",)
    prefetch_count = 0

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        raise NotImplementedError

    def get_metadata(self, index):
        raise NotImplementedError

    def load_batches(self, *a, **k):
        raise NotImplementedError

    def prefetch(self, *a, **k):
        pass

    def prefetch_fused_batches(self, *a, **k):
        pass

    def get_fused_batches(self):
        return iter(())

    def has_pending_fused_batches(self):
        return False

    def cancel_prefetch(self, index=None):
        pass

    def close(self):
        pass


def _rate(count):
    t0 = time.perf_counter()
    n = count()
    return n / (time.perf_counter() - t0) / 1e6


def main():
    nv = MultiDataset(*[_Child(n) for n in SIZES])
    for repl in (True, False):
        z = _rate(lambda: sum(len(b) for b in zbatch.MultiDatasetBatchSampler(
            SIZES, 256, replacement=repl, seed=1)))
        n = _rate(lambda: sum(len(b) for b in MultiDatasetBatchSampler(
            nv, batch_size=256, replacement=repl, seed=1)))
        print(f"MultiDatasetBatchSampler replacement={repl}: zbatch {z:.1f}, nvalchemi {n:.2f} "
              "M ids/s")
        z = _rate(lambda: sum(len(b) for b in zbatch.MultiDatasetSampler(
            SIZES, 256, replacement=repl, seed=1)))
        n = _rate(lambda: sum(1 for _ in MultiDatasetSampler(nv, replacement=repl, seed=1)))
        print(f"MultiDatasetSampler replacement={repl}: zbatch {z:.1f}, nvalchemi {n:.2f} M ids/s")


if __name__ == "__main__":
    main()
