"""Train a small energy model on atomistic graphs read by zbatch.

What it shows:

- writing structures in the nvalchemi AtomicData layout with ``zbatch.AtomicWriter``
  (``positions``, ``atomic_numbers``, ``neighbor_list``, ``energy`` per structure), with
  neighbour lists from ``zbatch.neighbor_list``;
- reading them with ``zbatch.DataLoader(..., output="torch")``: a batch concatenates the
  atoms and edges of its structures, offsets ``neighbor_list`` to index the batch's atoms, and
  carries ``batch_idx`` (the structure of each atom) and ``energy`` (one per structure);
- a per-atom model (one small MLP output per element, on radial features of each atom's
  neighbours) whose atomic energies are scatter-summed into structure energies.

The data is synthetic: random clusters of H, C and O atoms whose energy is a sum of
per-element offsets and smooth pair terms over neighbour pairs, so the model can learn it.

Run it from the repository root::

    PYTHONPATH=python .venv/bin/python examples/energy_model.py
    PYTHONPATH=python .venv/bin/python examples/energy_model.py --structures 20000 --epochs 10
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

import zbatch

ELEMENTS = np.array([1, 6, 8])               # H, C, O
CUTOFF = 3.0                                  # Angstrom


def cutoff_fn(r):
    """Goes smoothly from 1 at r = 0 to 0 at the cutoff (numpy or torch)."""
    cos = torch.cos if isinstance(r, torch.Tensor) else np.cos
    return 0.5 * (cos(np.pi * r / CUTOFF) + 1.0)


def make_structures(path: str, n_structures: int, seed: int = 0) -> list[dict]:
    """Writes ``n_structures`` random clusters at ``path`` and returns them as written.

    Energy of a structure: ``sum_i offset[z_i] + sum_{i<j, r_ij < cutoff}
    pair[z_i, z_j] * exp(-r_ij^2 / 2) * cutoff_fn(r_ij)``.
    """
    rng = np.random.default_rng(seed)
    offset = np.array([-0.5, -1.5, -2.0])
    pair = rng.normal(0.0, 1.0, size=(3, 3))
    pair = (pair + pair.T) / 2                 # symmetric in the two elements
    samples = []
    for _ in range(n_structures):
        n = int(rng.integers(4, 17))
        species = rng.integers(3, size=n)
        box = (n / 0.05) ** (1 / 3)            # about 0.05 atoms per cubic Angstrom
        pos = rng.uniform(0.0, box, size=(n, 3))
        i, j, _ = zbatch.neighbor_list(pos, None, False, CUTOFF)   # both directions, i != j
        r = np.linalg.norm(pos[j] - pos[i], axis=1)
        pair_terms = pair[species[i], species[j]] * np.exp(-r ** 2 / 2) * cutoff_fn(r)
        energy = offset[species].sum() + 0.5 * pair_terms.sum()   # each pair is listed twice
        samples.append({
            "positions": pos.astype(np.float32),
            "atomic_numbers": ELEMENTS[species],
            "neighbor_list": np.stack([i, j], axis=1),           # 0-based, per structure
            "energy": np.array([energy], dtype=np.float32),
        })
    zbatch.AtomicWriter(path).write(samples)
    return samples


class EnergyModel(torch.nn.Module):
    """Atomic energy = an MLP (one output per element, picked by the atom's element) of
    radial basis features summed over the atom's neighbours, per neighbour element."""

    def __init__(self, n_radial: int = 8, n_hidden: int = 32):
        super().__init__()
        self.register_buffer("centers", torch.linspace(0.0, CUTOFF, n_radial))
        self.register_buffer("species_of_z", torch.full((max(ELEMENTS) + 1,), -1,
                                                        dtype=torch.long))
        self.species_of_z[torch.as_tensor(ELEMENTS)] = torch.arange(len(ELEMENTS))
        self.n_radial = n_radial
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(len(ELEMENTS) * n_radial, n_hidden), torch.nn.SiLU(),
            torch.nn.Linear(n_hidden, len(ELEMENTS)))

    def forward(self, positions, atomic_numbers, neighbor_list, batch_idx, n_structures):
        species = self.species_of_z[atomic_numbers]                 # [atoms]
        src, dst = neighbor_list[:, 0], neighbor_list[:, 1]         # indices into the batch
        r = (positions[dst] - positions[src]).norm(dim=1)           # [edges]
        rbf = torch.exp(-4.0 * (r[:, None] - self.centers) ** 2) * cutoff_fn(r)[:, None]
        # features of atom i: radial basis of its neighbours, one block per neighbour element
        edge_feat = torch.zeros(len(r), len(ELEMENTS), self.n_radial, dtype=rbf.dtype)
        edge_feat[torch.arange(len(r)), species[dst]] = rbf
        atom_feat = torch.zeros(len(species), len(ELEMENTS) * self.n_radial, dtype=rbf.dtype)
        atom_feat.index_add_(0, src, edge_feat.flatten(1))
        atom_energy = self.mlp(atom_feat).gather(1, species[:, None]).squeeze(1)   # [atoms]
        energy = torch.zeros(n_structures, dtype=atom_energy.dtype)
        return energy.index_add(0, batch_idx, atom_energy)       # scatter-sum per structure


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--structures", type=int, default=2000, help="structures to synthesise")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch's intra-op threads (leave cores to zbatch's reader threads)")
    p.add_argument("--store", help="write the store here (default: a temporary directory)")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    """Runs the example; returns one ``{"epoch", "loss", "rmse"}`` dict per epoch (loss: mean
    squared error of the structure energies)."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)   # see cell_classifier.py
    with tempfile.TemporaryDirectory() as tmp:
        path = args.store or os.path.join(tmp, "atoms.zarr")
        make_structures(path, args.structures, seed=args.seed)

        ds = zbatch.open(path)
        print(f"{path}: {len(ds)} structures")
        loader = zbatch.DataLoader(ds, batch_size=args.batch_size, sampler="random",
                                   seed=args.seed, output="torch")
        model = EnergyModel()
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

        history = []
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            t0 = time.perf_counter()
            total, count = 0.0, 0
            for batch in loader:
                target = batch["energy"].reshape(-1)                 # [structures]
                pred = model(batch["positions"], batch["atomic_numbers"],
                             batch["neighbor_list"], batch["batch_idx"], len(target))
                loss = torch.nn.functional.mse_loss(pred, target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item() * len(target)
                count += len(target)
            mse = total / count
            print(f"epoch {epoch}: loss (MSE) {mse:.4f}  RMSE {mse ** 0.5:.4f} eV  "
                  f"({time.perf_counter() - t0:.2f} s)")
            history.append({"epoch": epoch, "loss": mse, "rmse": mse ** 0.5})
        loader.close()
    return history


if __name__ == "__main__":
    main()
