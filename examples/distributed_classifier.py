"""The cell-line classifier of cell_classifier.py, trained with DistributedDataParallel.

What it shows:

- ``zbatch.DataLoader`` under ``torch.distributed``: created after
  ``init_process_group``, the loader takes its rank and world size from the process group
  (no arguments needed), and each rank reads its own share of every epoch: rank ``r`` of
  ``W`` takes global batches ``r, r + W, r + 2W, ...`` of the epoch's order, so the ranks
  see disjoint cells and, together, every cell once per epoch;
- ``loader.set_epoch(epoch)`` on every rank, as with torch's ``DistributedSampler``;
- DistributedDataParallel (gloo backend, CPU) over processes that this script starts itself
  with ``torch.multiprocessing.spawn`` on 127.0.0.1 and a free port.

Every rank gets the same number of batches (DDP needs that): when the epoch's global batches
do not divide evenly among the ranks, zbatch repeats batches from the start of the epoch on
the last ranks (``pad_or_drop="pad"``, the default; ``"drop"`` drops the tail instead). With
the default sizes here (8,192 cells, batches of 256, 2 ranks) nothing is repeated.

Run it from the repository root::

    PYTHONPATH=python .venv/bin/python examples/distributed_classifier.py
    PYTHONPATH=python .venv/bin/python examples/distributed_classifier.py --ranks 4 --epochs 8
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import zbatch
from cell_classifier import SparseMLP, make_cells, make_loader   # this directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, world_size: int, port: int, args: argparse.Namespace, path: str,
           out_dir: str) -> None:
    """One rank: trains on its share of each epoch and writes what it saw to ``out_dir``."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)             # (DDP also copies rank 0's weights to all ranks)

    ds = zbatch.open(path)
    loader = make_loader(ds, args.batch_size, args.seed)   # rank, world size: from dist
    assert (loader.rank, loader.world_size) == (rank, world_size)
    model = DistributedDataParallel(SparseMLP(args.genes, 64, args.lines))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    report = {"rank": rank, "epochs": []}
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)              # the same epoch on every rank
        ids = []
        totals = torch.zeros(3, dtype=torch.float64)   # loss sum, correct, cells
        for batch in loader:
            y = batch["obs/cell_line"].long()
            logits = model(batch["X"])
            loss = torch.nn.functional.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()                  # DDP averages the gradients over the ranks here
            optimizer.step()
            correct = int((logits.argmax(1) == y).sum())
            totals += torch.tensor([loss.item() * len(y), correct, len(y)], dtype=torch.float64)
            ids.append(batch["index"].numpy())
        seen_here = int(totals[2])
        dist.all_reduce(totals)              # the epoch's figures over all ranks
        report["epochs"].append({"ids": np.concatenate(ids).tolist(), "cells": seen_here,
                                 "loss": float(totals[0] / totals[2]),
                                 "accuracy": float(totals[1] / totals[2])})
    loader.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="processes (world size)")
    p.add_argument("--cells", type=int, default=8192)
    p.add_argument("--genes", type=int, default=512)
    p.add_argument("--lines", type=int, default=4, help="cell lines (classes)")
    p.add_argument("--signal", type=float, default=0.1,
                   help="extra mean count of each line's own genes (larger: easier)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads per rank")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    """Runs the example; returns one dict per epoch: ``loss`` and ``accuracy`` over all ranks,
    ``cells_per_rank`` and ``ids_per_rank`` (the cell ids each rank trained on)."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cells.zarr")
        make_cells(path, args.cells, args.genes, args.lines, args.signal, seed=args.seed)
        print(f"{path}: {args.cells} cells; training on {args.ranks} ranks")
        mp.spawn(worker, args=(args.ranks, free_port(), args, path, tmp), nprocs=args.ranks)
        reports = []
        for r in range(args.ranks):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                reports.append(json.load(f))

    history = []
    for epoch in range(args.epochs):
        per_rank = [rep["epochs"][epoch] for rep in reports]
        ids = [np.array(e["ids"], dtype=np.int64) for e in per_rank]
        times_seen = np.bincount(np.concatenate(ids), minlength=args.cells)
        disjoint = len(np.unique(np.concatenate(ids))) == sum(len(i) for i in ids)
        counts = [e["cells"] for e in per_rank]
        print(f"epoch {epoch}: loss {per_rank[0]['loss']:.4f}  "
              f"accuracy {per_rank[0]['accuracy']:.3f}  cells per rank {counts}  "
              f"ranks disjoint: {disjoint}  every cell once: {bool((times_seen == 1).all())}")
        history.append({"epoch": epoch, "loss": per_rank[0]["loss"],
                        "accuracy": per_rank[0]["accuracy"], "cells_per_rank": counts,
                        "ids_per_rank": [i.tolist() for i in ids]})
    return history


if __name__ == "__main__":
    main()
