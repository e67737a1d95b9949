"""Converting fairchem-style LMDB datasets (the OC20/OC22 S2EF, IS2RE and similar LMDBs that
fairchem's ``LmdbDataset`` reads) into an nvalchemi AtomicData store (shared FORMATS.md §8).

    >>> import zbatch
    >>> zbatch.convert_lmdb(["s2ef_train/"], "train.zarr")
    200000
    >>> ds = zbatch.open("train.zarr")

The LMDB layout is fairchem's: one LMDB per file (``subdir=False``; an input directory is read
as the sorted ``*.lmdb`` files in it, or as one LMDB environment when it holds ``data.mdb``);
entry k under the ascii key ``b"k"`` for k = 0 .. length - 1, where ``length`` is the pickled
integer under the key ``b"length"`` when there is one and the number of entries otherwise. A
value is a pickled ``dict`` or a pickled PyG ``torch_geometric.data.Data`` (the PyG 2 layout,
attributes in ``_store``, and the PyG 1 layout, attributes in the object itself). PyG is not
needed: its classes are read as the attribute dictionaries they pickle. Tensors are torch
tensors (torch is then needed to unpickle them) or numpy arrays.

Unpickling runs whatever the pickle names: convert only LMDBs you trust, as with
``torch.load(weights_only=False)``.

What an entry becomes (one sample; ``core/`` names are nvalchemi's AtomicData fields):

==========================  ==================================================================
``pos`` [n, 3]              ``positions`` (required)
``atomic_numbers`` [n]      ``atomic_numbers`` (int64; fairchem stores floats, which must be
                            integral; required)
``natoms``                  checked against n, not stored
``cell`` [1, 3, 3]          ``cell`` [3, 3] (zeros when absent)
``pbc``                     ``pbc`` [3]; when absent, periodic on every axis for a cell of
                            non-zero volume (fairchem's graphs assume periodic cells), else not
``force`` / ``forces``      ``forces``
``energy``, else ``y``      ``energy`` (``y`` goes to ``custom/`` when ``energy`` exists too)
``stress`` / ``virial``     ``stress`` / ``virial`` [3, 3] (Voigt order accepted)
``edge_index`` [2, E]       ``neighbor_list`` [E, 2] = (``edge_index[1]``, ``edge_index[0]``)
``cell_offsets`` [E, 3]     ``neighbor_list_shifts``, and ``shifts`` = offsets @ cell
other numbers               ``custom/`` fields (``tags``, ``fixed``, ``sid``, ``fid``,
                            ``y_relaxed``, ``distances``, ...) at the level of their first
                            dimension: n atoms, else E edges, else one row per system
strings, ``None``           not stored (one warning per name)
==========================  ==================================================================

The edge convention: fairchem's graphs use PyG's ``source_to_target`` flow with ``edge_index =
(neighbour, centre)`` and compute an edge vector as ``pos[edge_index[0]] - pos[edge_index[1]]
+ cell_offsets @ cell`` (``get_pbc_distances``); nvalchemi's is ``positions[j] - positions[i] +
neighbor_list_shifts @ cell`` with ``neighbor_list = (i, j)`` (see zbatch._ase). So i is
``edge_index[1]``, j is ``edge_index[0]`` and the shifts carry over unchanged: every edge keeps
its vector. An entry without ``edge_index`` gets its neighbour list from ``cutoff`` (libzbatch's
``neighbor_list``, as ``convert_ase`` builds them); without a cutoff that is an error.
"""
from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import numpy as np

from . import _atomic
from ._ase import (_Schema, _chain_first, _check_cutoff, _check_job, _name_ok, _numeric, _remove,
                   _voigt_to_3x3, _warn, _write_behind)
from ._neighbors import neighbor_list
from ._zbatch import ZbatchError

__all__ = ["convert_lmdb"]

PathLike = Union[str, "os.PathLike[str]"]

# fairchem names of nvalchemi core fields, and the level each one has.
_RENAMED = {"pos": "positions", "force": "forces", "forces": "forces"}
_CORE_SYSTEM = frozenset({"energy", "stress", "virial", "dipole", "charge", "spin"})
_TENSORS = frozenset({"stress", "virial"})
# Consumed by the structure itself (positions, cell, edges) or only checked.
_STRUCTURE = frozenset({"pos", "atomic_numbers", "natoms", "cell", "pbc", "edge_index",
                        "cell_offsets"})


class _PygObject:
    """Stands in for every ``torch_geometric`` class while unpickling: keeps the pickled state
    (the attribute dictionary), so no PyG version needs to be installed or to match."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__["_pickled"] = {}

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        self.__dict__["_pickled"] = state if isinstance(state, dict) else {}

    def attributes(self) -> dict[str, Any]:
        state = self.__dict__.get("_pickled", {})
        store = state.get("_store")
        if isinstance(store, _PygObject):  # PyG 2: Data._store is a GlobalStorage
            mapping = store.__dict__.get("_pickled", {}).get("_mapping", {})
            return dict(mapping) if isinstance(mapping, Mapping) else {}
        # PyG 1: the attributes are the object's own (fairchem's pyg2_data_transform reads
        # them the same way)
        return {k: v for k, v in state.items() if not str(k).startswith("_")}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch_geometric" or module.startswith("torch_geometric."):
            return _PygObject
        return super().find_class(module, name)


def _unpickle(raw: bytes, where: str) -> Any:
    import io
    try:
        return _Unpickler(io.BytesIO(raw)).load()
    except ModuleNotFoundError as e:
        hint = " (its tensors are torch tensors: install torch)" if e.name == "torch" else ""
        raise ValueError(f"{where}: the value cannot be unpickled: it needs the module "
                         f"{e.name!r}{hint}") from e
    except Exception as e:
        raise ValueError(f"{where}: the value cannot be unpickled ({type(e).__name__}: {e})"
                         ) from e


def _fields(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, _PygObject):
        return value.attributes()
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    raise ValueError(f"{where}: the value is a {type(value).__module__}."
                     f"{type(value).__name__}, not a dict or a PyG Data")


def _array(v: Any) -> Optional[np.ndarray]:
    if hasattr(v, "detach") and hasattr(v, "numpy"):  # a torch tensor
        v = v.detach().cpu().numpy()
    return _numeric(v)


def _sources(paths: list[str]) -> Iterator[tuple[str, bool]]:
    """(path, subdir) of each LMDB, in fairchem's order: a directory of .lmdb files sorted."""
    for p in paths:
        if os.path.isdir(p):
            if os.path.exists(os.path.join(p, "data.mdb")):
                yield p, True
                continue
            files = sorted(f for f in os.listdir(p) if f.endswith(".lmdb"))
            if not files:
                raise ValueError(f"{p}: a directory without .lmdb files (nor an LMDB "
                                 "environment's data.mdb)")
            for f in files:
                yield os.path.join(p, f), False
        else:
            yield p, False


def _entries(path: str, subdir: bool) -> Iterator[tuple[str, Any]]:
    """(where, unpickled value) of every entry of one LMDB, read in one read transaction."""
    import lmdb
    try:
        env = lmdb.open(path, subdir=subdir, readonly=True, lock=False, readahead=False,
                        meminit=False, max_readers=1)
    except lmdb.Error as e:
        raise ValueError(f"{path}: not an LMDB ({e})") from e
    try:
        with env.begin(buffers=False) as txn:
            raw_length = txn.get(b"length")
            if raw_length is not None:
                length = _unpickle(raw_length, f"{path}: key 'length'")
                if isinstance(length, bool) or not isinstance(length, (int, np.integer)) \
                        or length < 0:
                    raise ValueError(f"{path}: key 'length' holds {length!r}, not a number of "
                                     "entries")
            else:
                length = env.stat()["entries"]
            for k in range(int(length)):
                where = f"{path}: key '{k}'"
                raw = txn.get(str(k).encode("ascii"))
                if raw is None:
                    said = "its 'length' key says" if raw_length is not None else "it has"
                    raise ValueError(f"{where} is missing ({said} {length} entries, keyed "
                                     "'0' to 'length - 1')")
                yield where, _unpickle(raw, where)
    finally:
        env.close()


def _row_count(a: np.ndarray) -> Optional[int]:
    return int(a.shape[0]) if a.ndim >= 1 else None


def _structure(value: Any, where: str, cutoff: Optional[float], skipped: set[str]
               ) -> dict[str, tuple[str, np.ndarray]]:
    """The fields of one entry as name -> (level, array)."""
    raw = _fields(value, where)
    arrays: dict[str, np.ndarray] = {}
    for key, v in raw.items():
        if v is None:
            continue
        a = _array(v)
        if a is None:
            if key not in skipped:
                skipped.add(key)
                _warn(f"{where}: {key!r} is not numeric ({type(v).__name__}): not stored")
            continue
        arrays[key] = a
    for key in ("pos", "atomic_numbers"):
        if key not in arrays:
            raise ValueError(f"{where} has no {key!r} (fairchem's required fields are 'pos' "
                             "and 'atomic_numbers')")
    positions = arrays["pos"].astype(np.float64)
    if positions.ndim != 2 or positions.shape[1] != 3 or positions.shape[0] == 0:
        raise ValueError(f"{where}: 'pos' has shape {positions.shape}, not [n, 3] with n > 0")
    n = positions.shape[0]
    if not np.isfinite(positions).all():
        raise ValueError(f"{where}: 'pos' holds a value that is not finite")
    z = arrays["atomic_numbers"].reshape(-1)
    if z.shape[0] != n:
        raise ValueError(f"{where}: 'atomic_numbers' has {z.shape[0]} values for {n} atoms "
                         "('pos')")
    if z.dtype.kind == "f" and not (np.isfinite(z).all() and (z == np.round(z)).all()):
        raise ValueError(f"{where}: 'atomic_numbers' holds a value that is not an integer")
    natoms = arrays.get("natoms")
    if natoms is not None and natoms.size == 1 and int(natoms.reshape(-1)[0]) != n:
        raise ValueError(f"{where}: 'natoms' is {int(natoms.reshape(-1)[0])} but 'pos' has {n} "
                         "atoms")
    cell = arrays.get("cell", np.zeros((3, 3))).astype(np.float64)
    if cell.size != 9:
        raise ValueError(f"{where}: 'cell' has shape {cell.shape}, not [1, 3, 3] or [3, 3]")
    cell = cell.reshape(3, 3)
    if "pbc" in arrays:
        pbc = np.broadcast_to(arrays["pbc"].reshape(-1).astype(bool), (3,)).copy() \
            if arrays["pbc"].size in (1, 3) else None
        if pbc is None:
            raise ValueError(f"{where}: 'pbc' has shape {arrays['pbc'].shape}, not [3]")
    else:
        pbc = np.full(3, abs(np.linalg.det(cell)) > 0)
    nl, S, num_edges = _edges(arrays, where, n, positions, cell, pbc, cutoff)
    out: dict[str, tuple[str, np.ndarray]] = {
        "positions": ("atom", positions),
        "atomic_numbers": ("atom", z.astype(np.int64)),
        "cell": ("system", cell),
        "pbc": ("system", pbc),
        "neighbor_list": ("edge", nl),
        "neighbor_list_shifts": ("edge", S),
        "shifts": ("edge", S.astype(np.float64) @ cell),
    }
    energy_from = "energy" if "energy" in arrays else "y" if "y" in arrays else None
    for key, a in arrays.items():
        if key in _STRUCTURE:
            continue
        name = _RENAMED.get(key, "energy" if key == energy_from else key)
        if name in out:
            if key not in skipped:  # `force` and `forces` both present: the first wins
                skipped.add(key)
                _warn(f"{where}: {key!r} is another {name!r}: not stored")
            continue
        if not _name_ok(name):
            if key not in skipped:
                skipped.add(key)
                _warn(f"{where}: {key!r} is not a valid array name: not stored")
            continue
        core_level = _atomic._CORE_LEVELS.get(name)
        if name in _CORE_SYSTEM or (core_level is None and _row_count(a) not in (n, num_edges)):
            level = "system"
        elif core_level is not None:
            level = core_level
        else:
            level = "atom" if _row_count(a) == n else "edge"
        if level == "system":
            a = _voigt_to_3x3(a.reshape(-1), f"{where}: {key!r}") if name in _TENSORS else a
            a = a.reshape(()) if a.size == 1 else _atomic._system_row(a)
        elif _row_count(a) != (n if level == "atom" else num_edges):
            what = f"{n} atoms" if level == "atom" else f"{num_edges} edges"
            raise ValueError(f"{where}: {key!r} has shape {a.shape}, not one row per "
                             f"{level} ({what})")
        out[name] = (level, a)
    return out


def _edges(arrays: dict[str, np.ndarray], where: str, n: int, positions: np.ndarray,
           cell: np.ndarray, pbc: np.ndarray, cutoff: Optional[float]
           ) -> tuple[np.ndarray, np.ndarray, int]:
    """(neighbor_list [E, 2], neighbor_list_shifts [E, 3], E) from edge_index and
    cell_offsets, or from the cutoff when the entry has no edges."""
    if "edge_index" not in arrays:
        if cutoff is None:
            raise ValueError(f"{where} has no 'edge_index': pass a cutoff (--cutoff R) to "
                             "compute its neighbour list")
        try:
            i, j, S = neighbor_list(positions, cell, pbc, cutoff)
        except ZbatchError as e:
            raise ValueError(f"{where}: {e}") from e
        return np.stack([i, j], axis=1), S, int(i.shape[0])
    ei = arrays["edge_index"]
    if ei.ndim != 2 or ei.shape[0] != 2 or ei.dtype.kind not in "iu":
        raise ValueError(f"{where}: 'edge_index' has shape {ei.shape} ({ei.dtype}), not an "
                         "integer [2, E]")
    E = int(ei.shape[1])
    if E and (ei.min() < 0 or ei.max() >= n):
        bad = int(ei.min() if ei.min() < 0 else ei.max())
        raise ValueError(f"{where}: 'edge_index' holds atom {bad}, outside 0..{n - 1}")
    nl = np.stack([ei[1], ei[0]], axis=1).astype(np.int64)  # (centre i, neighbour j)
    if "cell_offsets" in arrays:
        off = arrays["cell_offsets"]
        if off.shape != (E, 3):
            raise ValueError(f"{where}: 'cell_offsets' has shape {off.shape}, not [{E}, 3] "
                             "(one row per edge of 'edge_index')")
        if off.dtype.kind == "f" and not (np.isfinite(off).all() and (off == np.round(off)).all()):
            raise ValueError(f"{where}: 'cell_offsets' holds a value that is not an integer")
        S = off.astype(np.int64)
    else:
        S = np.zeros((E, 3), np.int64)
    return nl, S, E


class _Shapes:
    """Row shapes fixed by the first entry (the writer would refuse a change, without naming
    the entry)."""

    def __init__(self) -> None:
        self.rows: Optional[dict[str, tuple[int, ...]]] = None

    def check(self, sample: dict[str, np.ndarray], levels: dict[str, str], where: str) -> None:
        rows = {k: (a.shape if levels[k] == "system" else a.shape[1:]) for k, a in sample.items()}
        if self.rows is None:
            self.rows = rows
            return
        for k, shape in rows.items():
            if shape != self.rows[k]:
                what = "shape" if levels[k] == "system" else "row shape"
                raise ValueError(f"{where}: {k!r} has {what} {shape}, the first entry's is "
                                 f"{self.rows[k]}")


def convert_lmdb(inputs: Union[PathLike, Iterable[PathLike]], output: PathLike, *,
                 cutoff: Optional[float] = None, batch_size: int = 256, zarr_format: int = 3,
                 codec: Optional[str] = None, chunk_rows: Optional[int] = None,
                 shard_rows: Optional[int] = None, num_threads: int = 2,
                 progress: Optional[Callable[[int], Any]] = None) -> int:
    """Converts the entries of fairchem-style LMDBs into a new nvalchemi AtomicData store at
    ``output``; returns the number of entries written.

    Parameters
    ----------
    inputs : path or iterable of paths
        LMDB files, directories of ``.lmdb`` files (read in sorted order, as fairchem's
        ``LmdbDataset`` does) or LMDB environment directories (``data.mdb``).
    output : path
        The store's directory; must not exist yet (or be empty).
    cutoff : float, optional
        Neighbour cutoff in Å for entries without ``edge_index`` (an entry's own edges are
        always kept). Without it such an entry is an error.
    batch_size : int, default 256
        Entries converted and handed to the writer at a time: memory holds one batch (two
        when writing on a second thread), never the whole input.
    zarr_format : int, default 3
        Must be 3: the nvalchemi layout is Zarr v3.
    codec, chunk_rows, shard_rows : optional
        Storage of every array (see :class:`zbatch.ArrayConfig`); default the atomic writer's.
    num_threads : int, default 2
        1: read and write on the calling thread; 2 or more: write on a second thread while
        this one reads and unpickles.
    progress : callable, optional
        ``progress(done)`` after each batch and once at the end.

    The first entry fixes the fields and their row shapes (the module documentation says what
    each field becomes): a later entry without one of them, or with another shape, is an
    error naming the file and key; a field only later entries carry is dropped with a
    warning. Nothing is left at ``output`` when the conversion fails.

    Raises ``ValueError`` for a missing key (``length`` counts more entries than there are),
    a value that cannot be unpickled or is neither a dict nor a PyG Data, a missing ``pos`` or
    ``atomic_numbers``, shapes that disagree within an entry or with the first entry, or no
    entries at all; ``FileNotFoundError`` for a missing input; ``FileExistsError`` when
    ``output`` exists.

    Example::

        >>> n = zbatch.convert_lmdb(["oc20/s2ef/200k/train"], "oc20.zarr", codec="zstd:3")
    """
    if cutoff is not None:
        cutoff = _check_cutoff(cutoff)
    paths, out, batch_size = _check_job(inputs, output, zarr_format, batch_size, "input LMDBs",
                                        os.path.exists, "no such file or directory")
    sources = list(_sources(paths))
    created = not os.path.exists(out)

    schema, shapes = _Schema(), _Shapes()
    skipped: set[str] = set()
    done = 0

    def samples() -> Iterator[dict[str, np.ndarray]]:
        nonlocal done
        for path, subdir in sources:
            for where, value in _entries(path, subdir):
                if progress is not None and done and done % batch_size == 0:
                    progress(done)
                sample = schema.apply(_structure(value, where, cutoff, skipped), where)
                shapes.check(sample, schema.levels(), where)
                done += 1
                yield sample

    num_threads = max(1, int(num_threads))
    it = samples()
    try:
        first = next(it, None)
        if first is None:
            raise ValueError(f"no entries in {', '.join(paths)}")
        group = _atomic.ArrayConfig(codec=codec, chunk_rows=chunk_rows, shard_rows=shard_rows)
        config = _atomic.WriteConfig(meta=_atomic.ArrayConfig(codec=codec), core=group,
                                     custom=group, num_threads=max(1, num_threads - 1))
        levels = {k: v for k, v in schema.levels().items() if k not in _atomic._CORE_LEVELS}
        writer = _atomic.AtomicWriter(out, config, levels=levels, block_size=batch_size)
        if num_threads == 1:
            writer.write(_chain_first(first, it))
        else:
            _write_behind(writer, _chain_first(first, it), batch_size)
    except BaseException:
        _remove(out, created)
        raise
    if progress is not None:
        progress(done)
    return done
