"""zbatch behind torch's own ``torch.utils.data.DataLoader``, with worker processes.

For training code that insists on torch's DataLoader (Lightning's defaults, existing scripts),
zbatch offers two ways in; this example trains the classifier of cell_classifier.py through
each, with ``num_workers=2``:

1. **map-style**: a ``zbatch.Dataset`` is a torch map-style dataset (``len(ds)``, ``ds[i]``).
   torch's sampler picks the ids; each worker process fetches a batch's ids with one
   coalesced read (``Dataset.__getitems__``) and ``zbatch.collate`` stacks the samples into
   a CSR batch. The dataset pickles as its path and re-opens itself in each worker.
2. **iterable**: ``zbatch.IterableLoader`` is a torch ``IterableDataset`` yielding whole
   zbatch batches (``batch_size=None`` in torch's DataLoader). Each worker runs zbatch's
   pipeline (sampler, C transforms) over its own share of the epoch's batches, so every cell
   is read once per epoch across the workers. Call ``set_epoch`` before each epoch.

Run it from the repository root::

    PYTHONPATH=python .venv/bin/python examples/torch_dataloader.py
    PYTHONPATH=python .venv/bin/python examples/torch_dataloader.py --cells 20000 --epochs 6
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import scipy.sparse as sp
import torch
from torch.utils.data import DataLoader

import zbatch
from cell_classifier import SparseMLP, make_cells   # this directory

TARGET_SUM = 1e4

# Sparse tensors that cross from a worker process are rebuilt by torch without invariant
# checks, and torch warns unless told whether to check: say so once, for every process.
torch.sparse.check_sparse_tensor_invariants.disable()


def collate_cells(samples: list[dict]) -> dict:
    """``collate_fn`` of the map-style loader, run in the worker processes: stacks the samples
    with ``zbatch.collate`` (a scipy CSR ``X`` of counts), normalises each cell to
    ``TARGET_SUM`` counts and takes ``log1p`` (what the C transforms do in the iterable
    loader), and hands torch tensors back."""
    b = zbatch.collate(samples)
    X = b["X"].astype(np.float32)
    totals = np.asarray(X.sum(axis=1)).ravel()
    X = sp.diags(TARGET_SUM / np.maximum(totals, 1e-12)) @ X     # rows scaled, still CSR
    X = X.tocsr()
    X.data = np.log1p(X.data)
    return {"X": torch.sparse_csr_tensor(torch.from_numpy(X.indptr.astype(np.int64)),
                                         torch.from_numpy(X.indices.astype(np.int64)),
                                         torch.from_numpy(X.data), size=X.shape),
            "obs/cell_line": torch.from_numpy(b["obs/cell_line"]),
            "index": torch.from_numpy(b["index"])}


def map_style_loader(ds: zbatch.Dataset, batch_size: int, seed: int,
                     num_workers: int = 2) -> DataLoader:
    """torch's DataLoader over the dataset itself: torch shuffles, zbatch reads."""
    return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                      collate_fn=collate_cells,
                      generator=torch.Generator().manual_seed(seed),
                      persistent_workers=num_workers > 0)


def iterable_loader(ds: zbatch.Dataset, batch_size: int, seed: int,
                    num_workers: int = 2) -> tuple[zbatch.IterableLoader, DataLoader]:
    """torch's DataLoader over zbatch's pipeline: zbatch batches, samples and transforms."""
    it = zbatch.IterableLoader(ds, batch_size=batch_size, sampler="block", seed=seed,
                               block_size=64, output="torch", num_threads=1,
                               transforms=[("normalize_total", TARGET_SUM), "log1p"])
    return it, DataLoader(it, batch_size=None, num_workers=num_workers)


def train(model, optimizer, batches) -> tuple[float, float, int]:
    """One epoch over ``batches``: returns (mean loss, accuracy, cells seen)."""
    total, correct, seen = 0.0, 0, 0
    for batch in batches:
        y = batch["obs/cell_line"].long()
        logits = model(batch["X"])
        loss = torch.nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(y)
        correct += int((logits.argmax(1) == y).sum())
        seen += len(y)
    return total / seen, correct / seen, seen


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=8192)
    p.add_argument("--genes", type=int, default=512)
    p.add_argument("--lines", type=int, default=4, help="cell lines (classes)")
    p.add_argument("--signal", type=float, default=0.1,
                   help="extra mean count of each line's own genes (larger: easier)")
    p.add_argument("--epochs", type=int, default=3, help="epochs through each loader")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2, help="torch worker processes")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch's intra-op threads (leave cores to the workers)")
    return p.parse_args(argv)


def main(argv=None) -> dict[str, list[dict]]:
    """Runs the example; returns ``{"map-style": [...], "iterable": [...]}``, one
    ``{"epoch", "loss", "accuracy", "cells"}`` dict per epoch each."""
    args = parse_args(argv)
    torch.set_num_threads(args.torch_threads)   # see cell_classifier.py
    history: dict[str, list[dict]] = {"map-style": [], "iterable": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cells.zarr")
        make_cells(path, args.cells, args.genes, args.lines, args.signal, seed=args.seed)
        ds = zbatch.open(path)
        print(f"{path}: {len(ds)} cells, {args.workers} torch worker processes")

        for kind in history:
            torch.manual_seed(args.seed)           # the same initial model for both
            model = SparseMLP(args.genes, 64, args.lines)
            optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
            if kind == "map-style":
                loader = map_style_loader(ds, args.batch_size, args.seed, args.workers)
            else:
                it, loader = iterable_loader(ds, args.batch_size, args.seed, args.workers)
            for epoch in range(args.epochs):
                if kind == "iterable":
                    it.set_epoch(epoch)            # workers get a fresh copy each epoch
                t0 = time.perf_counter()
                loss, acc, seen = train(model, optimizer, loader)
                print(f"{kind:9s} epoch {epoch}: loss {loss:.4f}  accuracy {acc:.3f}  "
                      f"cells {seen}  ({time.perf_counter() - t0:.2f} s)")
                history[kind].append({"epoch": epoch, "loss": loss, "accuracy": acc,
                                      "cells": seen})
            del loader                              # stops the persistent workers
    return history


if __name__ == "__main__":
    main()
