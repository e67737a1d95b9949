"""Train a small cell-line classifier on an AnnData store read by zbatch.

What it shows:

- writing an AnnData Zarr store with ``zbatch.write_anndata`` (sparse CSR counts and an
  ``obs`` DataFrame with a categorical ``cell_line`` column);
- reading it with ``zbatch.DataLoader``: the ``"block"`` sampler (shuffled blocks of
  contiguous cells, so reads stay contiguous), C transforms (``normalize_total`` then
  ``log1p``) and ``output="torch"`` batches, whose ``X`` is a ``torch.sparse_csr_tensor``;
- a first layer that multiplies the sparse batch directly (no dense copy of the batch).

The data is synthetic: Poisson counts over a sparse background, where each cell line
expresses its own block of genes more strongly, so the classifier has something to learn.

Run it from the repository root::

    PYTHONPATH=python .venv/bin/python examples/cell_classifier.py
    PYTHONPATH=python .venv/bin/python examples/cell_classifier.py --cells 20000 --epochs 8
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

import zbatch

# torch calls its sparse CSR support "beta" and says so once per process
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")


def make_cells(path: str, n_cells: int, n_genes: int, n_lines: int, signal: float = 0.1,
               seed: int = 0):
    """Writes a synthetic AnnData store at ``path`` and returns ``(X, labels)``.

    ``X`` is a CSR matrix of integer counts (cells x genes), ``labels`` the cell line of each
    cell (codes of the categorical ``obs/cell_line``). Cell line ``k`` has raised expression
    of genes ``[k * block, (k + 1) * block)``; every cell also has a random library size.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(n_lines, size=n_cells)
    background = rng.gamma(0.3, 0.5, size=n_genes)        # most genes are rarely seen
    block = n_genes // (2 * n_lines)
    rates = np.broadcast_to(background, (n_cells, n_genes)).copy()
    for k in range(n_lines):
        rates[labels == k, k * block:(k + 1) * block] += signal
    library = rng.lognormal(0.0, 0.5, size=(n_cells, 1))   # sequencing depth varies per cell
    X = sp.csr_matrix(rng.poisson(rates * library).astype(np.float32))

    obs = pd.DataFrame(
        {"cell_line": pd.Categorical.from_codes(labels, [f"line_{k}" for k in range(n_lines)])},
        index=[f"cell_{i}" for i in range(n_cells)])
    var = pd.DataFrame(index=[f"gene_{j}" for j in range(n_genes)])
    zbatch.write_anndata(path, X, obs=obs, var=var)   # counts stored as uint8 when they fit
    return X, labels


class SparseMLP(torch.nn.Module):
    """An MLP whose first layer multiplies a sparse CSR batch: only the non-zeros count."""

    def __init__(self, n_genes: int, n_hidden: int, n_classes: int):
        super().__init__()
        self.first = torch.nn.Linear(n_genes, n_hidden)
        self.rest = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(n_hidden, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sparse.mm(x, self.first.weight.t()) + self.first.bias
        return self.rest(h)


def make_loader(ds: zbatch.Dataset, batch_size: int, seed: int) -> zbatch.DataLoader:
    """zbatch's loader as this example uses it (the distributed example uses it too)."""
    return zbatch.DataLoader(ds, batch_size=batch_size, sampler="block", block_size=64,
                             seed=seed, output="torch",
                             transforms=[("normalize_total", 1e4), "log1p"])


def train_epoch(model, loader, optimizer) -> tuple[float, float, int]:
    """One pass over ``loader``: returns (mean loss, accuracy, cells seen)."""
    total_loss, correct, seen = 0.0, 0, 0
    for batch in loader:
        x = batch["X"]                          # torch.sparse_csr_tensor, float32, log1p'd
        y = batch["obs/cell_line"].long()       # category codes (int8 in the store)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * len(y)
        correct += int((logits.argmax(1) == y).sum())
        seen += len(y)
    return total_loss / seen, correct / seen, seen


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=8192, help="cells to synthesise")
    p.add_argument("--genes", type=int, default=512, help="genes per cell")
    p.add_argument("--lines", type=int, default=4, help="cell lines (classes)")
    p.add_argument("--signal", type=float, default=0.1,
                   help="extra mean count of each line's own genes (larger: easier)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch's intra-op threads (leave cores to zbatch's reader threads)")
    p.add_argument("--store", help="write the store here (default: a temporary directory)")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    """Runs the example; returns one ``{"epoch", "loss", "accuracy"}`` dict per epoch."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    # torch's OpenMP threads spin while they wait for work: on a machine with few cores they
    # take the CPU from zbatch's reader threads (15x slower epochs here on 2 cores). A model
    # this small gains nothing from more threads anyway.
    torch.set_num_threads(args.torch_threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.store or os.path.join(tmp, "cells.zarr")
        make_cells(path, args.cells, args.genes, args.lines, args.signal, seed=args.seed)

        ds = zbatch.open(path)
        print(f"{path}: {len(ds)} cells x {args.genes} genes, "
              f"cell lines {ds.categories('obs/cell_line')}")
        loader = make_loader(ds, args.batch_size, args.seed)
        model = SparseMLP(args.genes, 64, args.lines)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

        history = []
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)             # a fresh order every epoch, reproducible
            t0 = time.perf_counter()
            loss, acc, _ = train_epoch(model, loader, optimizer)
            print(f"epoch {epoch}: loss {loss:.4f}  accuracy {acc:.3f}  "
                  f"({time.perf_counter() - t0:.2f} s)")
            history.append({"epoch": epoch, "loss": loss, "accuracy": acc})
        loader.close()
    return history


if __name__ == "__main__":
    main()
