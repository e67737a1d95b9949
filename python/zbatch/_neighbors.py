"""Neighbour lists of atomic structures, computed by libzbatch (``zb_neighbor_list_build`` in
include/zbatch_neighbors.h).

    >>> import zbatch
    >>> from ase.build import bulk
    >>> atoms = bulk("Cu", cubic=True).repeat(2)
    >>> i, j, S = zbatch.neighbor_list(atoms.positions, atoms.cell, atoms.pbc, 3.0)
    >>> D = atoms.positions[j] - atoms.positions[i] + S @ atoms.cell   # |D| < 3.0
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import _zbatch

__all__ = ["neighbor_list"]


def neighbor_list(positions: Any, cell: Any, pbc: Any, cutoff: float, *,
                  max_pairs: Optional[int] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ordered pair of atoms closer than ``cutoff``, periodic images included.

    Returns ``(i, j, S)``: int64 arrays of shapes [E], [E] and [E, 3] such that
    ``|positions[j] - positions[i] + S @ cell| < cutoff`` (strict), for every such triple but
    ``i == j`` with ``S == 0`` — the set ``ase.neighborlist.neighbor_list("ijS", atoms,
    cutoff)`` returns: both directions are listed, an atom meets its own periodic images, and a
    cutoff larger than the cell lists each image within reach. Pairs are grouped by ``i`` in
    increasing order (the order within one ``i`` differs from ASE's).

    Parameters
    ----------
    positions : array_like [n, 3]
        Cartesian positions (any float type; computed in float64). Atoms may lie outside the
        cell; ``S`` is relative to the positions as given.
    cell : array_like [3, 3] or None
        Lattice vectors as rows (an ``ase.cell.Cell`` works). Vectors of non-periodic axes are
        not used and may be zero; None is the zero cell (no axis may then be periodic).
    pbc : bool or array_like [3]
        Periodicity along each lattice vector.
    cutoff : float
        The cutoff radius, > 0.
    max_pairs : int, optional
        Fail (``ZbatchError`` ``ZB_E_OVERFLOW``) rather than return more pairs than this.

    Raises :class:`zbatch.ZbatchError` with status ``ZB_E_INVALID`` for a cutoff that is not a
    finite number > 0, a non-finite position (the message names the atom) or a singular
    periodic cell. The GIL is released while the list is built.

    In nvalchemi's AtomicData terms: ``neighbor_list = stack([i, j], 1)`` (source, target),
    ``neighbor_list_shifts = S`` and ``shifts = S @ cell`` (Cartesian).
    """
    pos = np.ascontiguousarray(positions, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[1] != 3:
        if pos.size == 0:
            pos = pos.reshape(0, 3)
        else:
            raise ValueError(f"positions must have shape (n, 3), got {pos.shape}")
    c = np.zeros((3, 3)) if cell is None else np.ascontiguousarray(cell, dtype=np.float64)
    if c.shape != (3, 3):
        raise ValueError(f"cell must have shape (3, 3), got {c.shape}")
    p = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    if max_pairs is not None and int(max_pairs) < 1:
        raise ValueError(f"max_pairs must be at least 1 (or None), got {max_pairs}")
    i, j, s = _zbatch.neighbor_list(pos, pos.shape[0], c, bool(p[0]), bool(p[1]), bool(p[2]),
                                    float(cutoff), int(max_pairs or 0))
    return (np.frombuffer(i, dtype=np.int64), np.frombuffer(j, dtype=np.int64),
            np.frombuffer(s, dtype=np.int64).reshape(-1, 3))
