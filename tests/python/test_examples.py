"""The scripts in examples/ run and do what they say (issue 18, item 5).

Each example generates its own data, trains for a few epochs and returns (or prints) its
per-epoch losses: the loss must fall by a clear margin and the classifiers must beat chance by
far. The distributed example must give the ranks disjoint shares that cover every cell exactly
once per epoch. torch's DataLoader over zbatch (worker processes, both the map-style dataset
and zbatch.IterableLoader) must deliver the values that were written, the same batches
zbatch's own reader gives for the same ids.

Everything is seeded; the margins are far from the values seen (noted next to each check).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import zbatch_api

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
if str(EXAMPLES) not in sys.path:   # the examples import each other (cell_classifier)
    sys.path.insert(0, str(EXAMPLES))

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch

zbatch = zbatch_api()

import cell_classifier  # noqa: E402
import distributed_classifier  # noqa: E402
import torch_dataloader  # noqa: E402


@pytest.fixture(autouse=True)
def _torch_threads():
    """The examples set torch's thread count; give the rest of the suite its own back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def normalized(X, rows):
    """log1p of each cell scaled to 10,000 counts, computed here in float64 from the counts
    that were written (the oracle for both loaders' X)."""
    x = X[rows].toarray().astype(np.float64)
    return np.log1p(x * (1e4 / np.maximum(x.sum(1, keepdims=True), 1e-12)))


def test_cell_classifier_learns():
    history = cell_classifier.main([])
    losses = [h["loss"] for h in history]
    assert len(losses) == 5
    assert losses[-1] < 0.5 * losses[0], losses          # seen: 0.58 -> 0.10
    assert history[-1]["accuracy"] > 0.8, history        # 4 lines: chance 0.25; seen 0.97


def test_energy_model_learns_as_a_script():
    """Run as the docstring says, in a subprocess; the losses are parsed from its output."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    out = subprocess.run([sys.executable, str(EXAMPLES / "energy_model.py")], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    losses = [float(m) for m in re.findall(r"loss \(MSE\) ([0-9.]+)", out.stdout)]
    assert len(losses) == 6, out.stdout
    assert losses[-1] < 0.05 * losses[0], out.stdout     # seen: 28.9 -> 0.03


def test_distributed_classifier_covers_every_cell_once_per_epoch():
    history = distributed_classifier.main([])            # 2 ranks, 8,192 cells, batches of 256
    n = 8192
    for h in history:
        ids = [np.asarray(i) for i in h["ids_per_rank"]]
        assert h["cells_per_rank"] == [n // 2, n // 2]
        assert [len(i) for i in ids] == [n // 2, n // 2]
        assert len(np.intersect1d(ids[0], ids[1])) == 0              # disjoint shares
        assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(n))   # each cell once
    orders = [tuple(h["ids_per_rank"][0][:64]) for h in history]
    assert len(set(orders)) == len(orders)               # a fresh order every epoch
    losses = [h["loss"] for h in history]
    assert losses[-1] < 0.5 * losses[0], losses          # seen: 0.89 -> 0.12
    assert history[-1]["accuracy"] > 0.8, history        # seen 0.96


def test_torch_dataloader_example_learns():
    history = torch_dataloader.main([])
    for kind in ("map-style", "iterable"):
        losses = [h["loss"] for h in history[kind]]
        assert [h["cells"] for h in history[kind]] == [8192] * 3, kind   # every cell, each epoch
        assert losses[-1] < 0.5 * losses[0], (kind, losses)   # seen: 0.58 -> 0.12
        assert history[kind][-1]["accuracy"] > 0.8, (kind, history[kind])   # seen 0.96


@pytest.fixture(scope="module")
def small_cells(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("examples") / "cells.zarr")
    X, labels = cell_classifier.make_cells(path, 1500, 96, 3, signal=0.5, seed=3)
    return path, X.tocsr(), labels


def test_torch_map_style_batches_are_the_written_values(small_cells):
    """torch's DataLoader over the zbatch.Dataset, two worker processes: every batch holds the
    written cells of its ids (normalised as the example does), as zbatch's own read_many of
    the same ids does."""
    path, X, labels = small_cells
    ds = zbatch.open(path)
    batches = list(torch_dataloader.map_style_loader(ds, batch_size=128, seed=5, num_workers=2))
    ids = [b["index"].numpy() for b in batches]
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(X.shape[0]))
    assert len(batches) == 12 and [len(i) for i in ids[:-1]] == [128] * 11

    for b, rows in zip(batches, ids):
        mine = ds.read_many(rows)                        # zbatch's own read of the same ids
        assert np.array_equal(mine["index"], rows)
        assert (mine["X"] != X[rows]).nnz == 0          # ... holds the written counts
        x = b["X"].to_dense().numpy()
        np.testing.assert_allclose(x, normalized(X, rows), rtol=1e-5, atol=1e-6)
        assert np.array_equal(b["obs/cell_line"].numpy(), labels[rows])
        assert np.array_equal(mine["obs/cell_line"], labels[rows])


def test_torch_iterable_batches_are_zbatchs_own(small_cells):
    """torch's DataLoader over zbatch.IterableLoader, two worker processes: the workers split
    the epoch's global batches between them, and those are exactly zbatch.DataLoader's batches
    for the same sampler, seed and epoch, holding the written values."""
    path, X, labels = small_cells
    ds = zbatch.open(path)
    it, dl = torch_dataloader.iterable_loader(ds, batch_size=128, seed=7, num_workers=2)
    own = zbatch.DataLoader(ds, batch_size=128, sampler="block", block_size=64, seed=7,
                            output="torch", transforms=[("normalize_total", 1e4), "log1p"])
    for epoch in (0, 1):
        it.set_epoch(epoch)
        own.set_epoch(epoch)
        got = {tuple(b["index"].tolist()): b for b in dl}
        want = {tuple(b["index"].tolist()): b for b in own}
        assert set(got) == set(want) and len(got) == 12, epoch   # the same batches
        assert np.array_equal(np.sort(np.concatenate([list(k) for k in got])),
                              np.arange(X.shape[0]))              # each cell once
        for key, b in got.items():
            rows = np.array(key)
            x = b["X"].to_dense().numpy()
            assert np.array_equal(x, want[key]["X"].to_dense().numpy())
            np.testing.assert_allclose(x, normalized(X, rows), rtol=1e-5, atol=1e-6)
            assert np.array_equal(b["obs/cell_line"].numpy(), labels[rows])
    own.close()
