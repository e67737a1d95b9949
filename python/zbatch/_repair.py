"""Repairing nvalchemi AtomicData stores damaged by nvalchemi-toolkit 0.2.0's own writer
(FORMATS.md §8.5): ``append`` stores the appended samples' edge indices without the store's atom
offset (negative indices, -5,820 and the like) and ``defragment`` copies stored indices without
re-offsetting them (indices past the sample). zbatch refuses such stores on open; ``repair``
writes a corrected copy beside the damaged store, never touching it.

    >>> import zbatch
    >>> zbatch.repair("traj.zarr")                   # writes traj.repaired.zarr
    {'output': '/data/traj.repaired.zarr', 'samples': 1200, 'rebased': 1100}

The recovery rule. Each sample's ``neighbor_list`` rows were written with one unknown base b:
stored = local + b, with every local index in [0, n) for the sample's n atoms (both damaging
paths add one offset per sample, the wrong one). A sample whose stored indices all lie in its
own atom range [atoms_ptr[p], atoms_ptr[p + 1]) is intact (b = atoms_ptr[p]). Otherwise the
bases that put every index in [0, n) are max(stored) - n + 1 .. min(stored): when the edges
reach both the sample's first and last atom (max - min = n - 1, as in any neighbour list where
every atom has a neighbour) there is exactly one, and the local indices are stored - b. When
several bases fit (an end atom without neighbours) or none does (the indices span more than n
atoms), the sample is not recoverable unambiguously and ``repair`` refuses, naming it.
Soft-deleted samples (nvalchemi zero-fills them) are left out: the repaired store holds the live
samples, in order, with every array, as a fresh write of them would. Arrays that nvalchemi's
append did not extend (hazard 3: their rows for the appended samples were never written) cannot
be recovered either; ``repair`` refuses those stores too.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator, Optional, Union

import numpy as np

from . import _atomic
from ._ase import _remove

__all__ = ["repair"]

PathLike = Union[str, "os.PathLike[str]"]


class _Store:
    """The raw arrays of an atomic store, read with libzbatch's array reader (the atomic
    reader refuses damaged stores, which is the point)."""

    def __init__(self, path: str) -> None:
        from . import read_array
        self.path, self._read = path, read_array
        root = os.path.join(path, "zarr.json")
        if not os.path.isfile(root):
            raise FileNotFoundError(f"{path}: no zarr.json (not a Zarr v3 store)")
        with open(root, encoding="utf-8") as f:
            attrs = json.load(f).get("attributes") or {}
        if "fields" not in attrs:
            raise ValueError(f"{path}: the root has no 'fields' attribute: not an nvalchemi "
                             "AtomicData store")
        fields = attrs["fields"]
        self.atoms_ptr = self.read("meta/atoms_ptr").astype(np.int64)
        self.edges_ptr = self.read("meta/edges_ptr").astype(np.int64)
        self.live = self.read("meta/samples_mask").astype(bool)
        n = len(self.live)
        if len(self.atoms_ptr) != n + 1 or len(self.edges_ptr) != n + 1:
            raise ValueError(f"{path}: meta/atoms_ptr has {len(self.atoms_ptr)} entries and "
                             f"meta/edges_ptr {len(self.edges_ptr)} for {n} samples "
                             f"(meta/samples_mask); both need {n + 1}: the pointers cannot be "
                             "recovered")
        for name, ptr in (("atoms_ptr", self.atoms_ptr), ("edges_ptr", self.edges_ptr)):
            if ptr[0] != 0 or np.any(np.diff(ptr) < 0):
                raise ValueError(f"{path}: meta/{name} does not start at 0 and grow: the "
                                 "pointers cannot be recovered")
        # name -> (group, level, rows) of every core and custom array (FORMATS.md §8.1: a core
        # array missing from `fields` takes its key set's level, a custom one is system-level)
        self.arrays: dict[str, tuple[str, str]] = {}
        for group in ("core", "custom"):
            d = os.path.join(path, group)
            if not os.path.isdir(d):
                continue
            for name in sorted(os.listdir(d)):
                if not os.path.isfile(os.path.join(d, name, "zarr.json")):
                    continue
                level = (fields.get(group) or {}).get(name)
                if level is None:
                    level = _atomic._CORE_LEVELS.get(name, "atom") if group == "core" else "system"
                level = "atom" if level == "node" else level
                self.arrays[name] = (group, level)
        for name, (group, level) in self.arrays.items():
            # nvalchemi concatenates edge arrays named like (index|face) along their last axis
            # (FORMATS.md §8.2); zbatch reads edge rows along axis 0 only
            if level == "edge" and name != "neighbor_list" and re.search("index|face", name):
                raise ValueError(f"{path}: {group}/{name} is an edge array nvalchemi "
                                 "concatenates along its last axis, which zbatch does not read")
        for key in ("positions", "atomic_numbers"):
            if self.arrays.get(key, ("",))[0] != "core":
                raise ValueError(f"{path}: no core/{key}: not an nvalchemi AtomicData store")
        need = {"atom": int(self.atoms_ptr[-1]), "edge": int(self.edges_ptr[-1]), "system": n}
        for name, (group, level) in self.arrays.items():
            if level not in need:
                raise ValueError(f"{path}: {group}/{name} has level {level!r} in 'fields'")
            rows = self._rows(f"{group}/{name}")
            if rows != need[level]:
                raise ValueError(
                    f"{path}: {group}/{name} has {rows} rows where its {level} level needs "
                    f"{need[level]}: nvalchemi's append did not extend it (FORMATS §8.5, "
                    "hazard 3), so the appended samples' values of it were never written and "
                    "cannot be recovered")

    def ndim(self, name: str) -> int:
        return len(self._shape(f"{self.arrays[name][0]}/{name}"))

    def read(self, name: str, start: int = 0, stop: Optional[int] = None) -> np.ndarray:
        return self._read(self.path, name, start, stop)

    def _rows(self, name: str) -> int:
        return int(self._shape(name)[0])

    def _shape(self, name: str) -> list:
        with open(os.path.join(self.path, name, "zarr.json"), encoding="utf-8") as f:
            return list(json.load(f).get("shape") or [0])


def _base(stored: np.ndarray, p: int, a0: int, n: int, path: str) -> Optional[int]:
    """The base the sample's edge indices were written with (see the module documentation),
    None when they are intact."""
    if stored.size == 0:
        return None
    lo, hi = int(stored.min()), int(stored.max())
    if a0 <= lo and hi < a0 + n:
        return None
    if hi - lo > n - 1:
        raise ValueError(f"{path}: sample {p}: core/neighbor_list spans stored atoms {lo}..{hi}, "
                         f"more than its {n} atoms: no single offset explains them, so the "
                         "sample cannot be repaired")
    if hi - lo < n - 1:
        raise ValueError(f"{path}: sample {p}: core/neighbor_list holds stored atoms {lo}..{hi} "
                         f"(outside its atoms {a0}..{a0 + n - 1}) and reaches only "
                         f"{hi - lo + 1} of its {n} atoms, so {n - (hi - lo)} offsets fit "
                         f"({hi - n + 1}..{lo}): the sample cannot be repaired unambiguously")
    return lo


def _blocks(store: _Store, block: int) -> Iterator[tuple[int, int]]:
    n = len(store.live)
    for p0 in range(0, n, block):
        yield p0, min(n, p0 + block)


def repair(store: PathLike, output: Optional[PathLike] = None, *, codec: Optional[str] = None,
           block_size: int = 4096) -> dict[str, Any]:
    """Writes a corrected copy of an nvalchemi AtomicData store whose edge indices nvalchemi's
    ``append`` or ``defragment`` damaged; the damaged store is only read.

    Parameters
    ----------
    store : path
        The damaged store.
    output : path, optional
        Where the corrected store goes: a new (or empty) directory, not ``store`` nor inside
        it. Default: beside ``store``, named ``NAME.repaired.zarr`` for ``NAME.zarr``.
    codec : str, optional
        Codec of every array of the new store (default the atomic writer's).
    block_size : int, default 4096
        Samples read and written at a time (memory holds one block of them).

    Returns a dict: ``output`` (its absolute path), ``samples`` (live samples written),
    ``rebased`` (samples whose edge indices were re-based), ``dropped`` (soft-deleted samples
    left out).

    The recovery rule is the module's (``zbatch._repair``). Raises ``ValueError`` naming the
    sample when its edge indices cannot be recovered unambiguously, and naming the array when
    pointers or rows are missing (what nvalchemi never wrote is not recoverable);
    ``FileNotFoundError`` when ``store`` is not a Zarr v3 store; ``FileExistsError`` when
    ``output`` exists. Nothing is left at ``output`` when the repair fails.

    Example::

        >>> zbatch.repair("traj.zarr", "traj-fixed.zarr")["rebased"]
        1100
    """
    src = os.path.abspath(os.fspath(store))
    if not os.path.isdir(src):
        raise FileNotFoundError(f"{src}: no such store")
    if output is None:
        base = src[:-5] if src.endswith(".zarr") else src
        output = base + ".repaired.zarr"
    out = os.path.abspath(os.fspath(output))
    if out == src or out.startswith(src + os.sep):
        raise ValueError(f"{out}: the repaired store must go beside {src}, not over or inside it")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise FileExistsError(f"{out} already exists")
    block_size = int(block_size)
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    s = _Store(src)
    if "neighbor_list" in s.arrays and s.arrays["neighbor_list"][1] != "edge":
        raise ValueError(f"{src}: core/neighbor_list is not an edge-level field")
    ap, ep = s.atoms_ptr, s.edges_ptr
    counts = {"rebased": 0}

    # A custom system field of one value per sample ([N]) is added whole after the samples:
    # through samples the writer would store it as [N, 1]. It is N values, small.
    scalars = [k for k, (g, lvl) in s.arrays.items()
               if g == "custom" and lvl == "system" and s.ndim(k) == 1]
    per_sample = {k: v for k, v in s.arrays.items() if k not in scalars}

    def samples() -> Iterator[dict[str, np.ndarray]]:
        for p0, p1 in _blocks(s, block_size):
            if not s.live[p0:p1].any():
                continue
            a0, e0 = int(ap[p0]), int(ep[p0])
            rows = {}
            for name, (group, level) in per_sample.items():
                lo, hi = {"atom": (a0, int(ap[p1])), "edge": (e0, int(ep[p1])),
                          "system": (p0, p1)}[level]
                rows[name] = (level, s.read(f"{group}/{name}", lo, hi))
            for p in range(p0, p1):
                if not s.live[p]:
                    continue
                sample = {}
                for name, (level, a) in rows.items():
                    if level == "atom":
                        sample[name] = a[ap[p] - a0:ap[p + 1] - a0]
                    elif level == "edge":
                        sample[name] = a[ep[p] - e0:ep[p + 1] - e0]
                    else:
                        sample[name] = a[p - p0]
                if "neighbor_list" in sample:
                    stored = sample["neighbor_list"].astype(np.int64)
                    n = int(ap[p + 1] - ap[p])
                    b = _base(stored, p, int(ap[p]), n, src)
                    counts["rebased"] += b is not None
                    sample["neighbor_list"] = stored - (int(ap[p]) if b is None else b)
                yield sample

    live = int(s.live.sum())
    if live == 0:
        raise ValueError(f"{src}: every sample is deleted: nothing to repair")
    created = not os.path.exists(out)
    float_dtype = s.read("core/positions", 0, 0).dtype
    levels = {k: lvl for k, (g, lvl) in per_sample.items() if g == "custom"}
    cfg = _atomic.ArrayConfig(codec=codec)
    writer = _atomic.AtomicWriter(out, _atomic.WriteConfig(meta=cfg, core=cfg, custom=cfg),
                                  levels=levels, float_dtype=float_dtype, block_size=block_size)
    try:
        writer.write(samples())
        for name in scalars:
            writer.add_custom(name, s.read(f"custom/{name}")[s.live], "system")
        writer.check()
    except BaseException:
        _remove(out, created)
        raise
    return {"output": out, "samples": live, "rebased": counts["rebased"],
            "dropped": len(s.live) - live}
