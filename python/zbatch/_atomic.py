"""Writing nvalchemi AtomicData stores (the layout nvalchemi-toolkit's ``AtomicDataZarrReader``
reads; shared FORMATS.md §8).

    >>> from zbatch import AtomicWriter
    >>> w = AtomicWriter("train.zarr", config={"core": {"codec": "zstd:3", "chunk_rows": 65536}})
    >>> w.write([{"positions": pos, "atomic_numbers": z, "energy": -3.2, "forces": f,
    ...           "cell": cell, "pbc": [True, True, True],
    ...           "neighbor_list": nl, "shifts": shifts}])       # nl: per-sample 0-based indices
    >>> w.append(ase_atoms_list)          # ase.Atoms with a calculator: energy and forces too
    >>> w.delete([3, 7])                  # logical indices: soft delete (masks only)
    >>> w.defragment()                    # rewrite without deleted samples, swap in atomically

The engine is libzbatch's atomic writer (``zb_atomic_*`` in include/zbatch_atomic.h); this
module only turns samples into per-field arrays.

Differences from nvalchemi's ``AtomicDataZarrWriter``, on purpose: ``neighbor_list`` is stored
store-global on every write *and* append (nvalchemi's append forgets the offset); an append must
extend every field, core and custom, or it fails before writing anything; ``delete`` takes
logical indices (the i-th live sample, what readers number) and does not zero the data;
``defragment`` re-offsets ``neighbor_list`` and never wipes the store first; every value is
checked before it is written (finite; integral and in range where the stored type is an integer;
``positions`` ``[atoms, 3]``), a ``ValueError`` naming the sample and the field otherwise.
Appending to a store nvalchemi wrote, the arrays its ``AtomicData`` fills itself
(``atomic_masses``, ``atom_categories``, ``velocities``) are filled the same way when a sample
lacks them.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from . import _zbatch
from ._remote import writable_options

__all__ = ["AtomicWriter", "ArrayConfig", "WriteConfig", "ATOM_KEYS", "EDGE_KEYS", "SYSTEM_KEYS",
           "sample_from_atoms"]

#: nvalchemi's AtomicData key sets (FORMATS.md §8.2): fields with these names go to ``core/``
#: at that level; every other key of a sample goes to ``custom/``.
ATOM_KEYS = frozenset({
    "atomic_masses", "positions", "forces", "charges", "node_embeddings", "atomic_numbers",
    "node_attrs", "node_alpha_spins", "node_beta_spins", "atom_categories", "velocities",
    "momenta", "kinetic_energies", "neighbor_matrix", "neighbor_matrix_shifts", "num_neighbors"})
EDGE_KEYS = frozenset({"shifts", "neighbor_list_shifts", "neighbor_list", "edge_embeddings"})
SYSTEM_KEYS = frozenset({"energy", "stress", "virial", "dipole", "charge", "graph_embeddings",
                         "cell", "pbc", "spin"})
_CORE_LEVELS = {**{k: "atom" for k in ATOM_KEYS}, **{k: "edge" for k in EDGE_KEYS},
                **{k: "system" for k in SYSTEM_KEYS}}
_INT_KEYS = {"atomic_numbers": np.int64, "neighbor_list": np.int64, "atom_categories": np.int64,
             "neighbor_list_shifts": np.int64, "neighbor_matrix": np.int64,
             "num_neighbors": np.int64}


_NO_SHARDS = 2**64 - 1  # ZB_ATOMIC_NO_SHARDS


def _rows(v: Optional[int], what: str, none_is: int) -> int:
    """None inherits (0 for the C config); 0 means `none_is`."""
    if v is None:
        return 0
    v = int(v)
    if v < 0:
        raise ValueError(f"{what} must be a non-negative number of rows")
    return none_is if v == 0 else v


@dataclass
class ArrayConfig:
    """Storage of one array, like nvalchemi's ``ZarrArrayConfig``; None members inherit (the
    override from its group, the group from zbatch's defaults).

    ``codec`` is a zbatch codec string (``"zstd:3"``, ``"blosc:lz4:5:shuffle"``, ``"none"``);
    ``chunk_rows`` counts rows per chunk along axis 0 (0 = automatic, about 1 MiB);
    ``shard_rows`` rows per shard, a multiple of chunk_rows (0 = not sharded).
    A core or custom array with neither set anywhere gets inner chunks of about 32 KiB in
    shards of 1,024 of them (random structures then decode little more than they deliver);
    the pointer and mask arrays ``meta`` get chunks of about 1 MiB, unsharded.
    """
    codec: Optional[str] = None
    chunk_rows: Optional[int] = None
    shard_rows: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return {"codec": self.codec, "chunk_rows": _rows(self.chunk_rows, "chunk_rows", 0),
                "shard_rows": _rows(self.shard_rows, "shard_rows", _NO_SHARDS)}


@dataclass
class WriteConfig:
    """Write configuration, like nvalchemi's ``ZarrWriteConfig``: per-group defaults (``meta``
    for pointers and masks, ``core``, ``custom``) and per-array ``field_overrides`` (keyed by
    ``"positions"`` or ``"core/positions"``). Precedence per member: override, group, default.
    """
    meta: ArrayConfig = field(default_factory=ArrayConfig)
    core: ArrayConfig = field(default_factory=ArrayConfig)
    custom: ArrayConfig = field(default_factory=ArrayConfig)
    field_overrides: dict[str, ArrayConfig] = field(default_factory=dict)
    num_threads: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta.to_dict(), "core": self.core.to_dict(),
                "custom": self.custom.to_dict(),
                "field_overrides": {k: v.to_dict() for k, v in self.field_overrides.items()},
                "num_threads": int(self.num_threads)}


ConfigLike = Union[WriteConfig, Mapping[str, Any], None]


def _array_config_dict(v: Any, where: str) -> dict[str, Any]:
    if isinstance(v, ArrayConfig):
        return v.to_dict()
    if v is None:
        return ArrayConfig().to_dict()
    if not isinstance(v, Mapping):
        raise TypeError(f"config {where}: expected an ArrayConfig or a dict, "
                        f"got {type(v).__name__}")
    unknown = set(v) - {"codec", "chunk_rows", "shard_rows", "chunk_size", "shard_size"}
    if unknown:
        raise ValueError(f"config {where}: unknown keys {sorted(unknown)}")
    # nvalchemi's names (chunk_size, shard_size) are accepted too
    return ArrayConfig(v.get("codec"), v.get("chunk_rows", v.get("chunk_size")),
                       v.get("shard_rows", v.get("shard_size"))).to_dict()


def _config_dict(config: ConfigLike) -> Optional[dict[str, Any]]:
    if config is None:
        return None
    if isinstance(config, WriteConfig):
        return config.to_dict()
    if not isinstance(config, Mapping):
        raise TypeError("config must be a WriteConfig, a dict or None")
    unknown = set(config) - {"meta", "core", "custom", "field_overrides", "num_threads"}
    if unknown:
        raise ValueError(f"config: unknown keys {sorted(unknown)}")
    return {g: _array_config_dict(config.get(g), g) for g in ("meta", "core", "custom")} | {
        "field_overrides": {str(k): _array_config_dict(v, f"field_overrides[{k!r}]")
                            for k, v in (config.get("field_overrides") or {}).items()},
        "num_threads": int(config.get("num_threads", 1))}


def sample_from_atoms(atoms: Any, cutoff: Optional[float] = None) -> dict[str, np.ndarray]:
    """The fields of one ``ase.Atoms``: positions, atomic_numbers, cell, pbc; energy and forces
    from its calculator (or from ``atoms.info["energy"]`` / ``atoms.arrays["forces"]``); and,
    when ``cutoff`` is given, neighbor_list (local indices) and shifts (Cartesian,
    ``S @ cell``) from ``ase.neighborlist.neighbor_list("ijS", atoms, cutoff)``.
    """
    d: dict[str, np.ndarray] = {
        "positions": np.asarray(atoms.get_positions()),
        "atomic_numbers": np.asarray(atoms.get_atomic_numbers()),
        "cell": np.asarray(atoms.get_cell().array),
        "pbc": np.asarray(atoms.get_pbc(), dtype=bool),
    }
    if atoms.calc is not None:
        d["energy"] = np.asarray(atoms.get_potential_energy())
        d["forces"] = np.asarray(atoms.get_forces())
    else:
        if "energy" in atoms.info:
            d["energy"] = np.asarray(atoms.info["energy"])
        if "forces" in atoms.arrays:
            d["forces"] = np.asarray(atoms.arrays["forces"])
    if cutoff is not None:
        from ase.neighborlist import neighbor_list
        cutoff = _check_images(atoms, d["cell"], d["pbc"], cutoff)
        i, j, s = neighbor_list("ijS", atoms, cutoff)
        d["neighbor_list"] = np.stack([i, j], axis=1).astype(np.int64)
        d["shifts"] = s.astype(np.float64) @ d["cell"]
    return d


MAX_CUTOFF_IMAGES = 10**6


def _check_images(atoms: Any, cell: np.ndarray, pbc: np.ndarray, cutoff: Any) -> float:
    """A cutoff for ``atoms``' neighbour list (:func:`zbatch._ase._check_cutoff`), refused when
    the periodic images of the cell it reaches exceed ``MAX_CUTOFF_IMAGES``: ASE would walk
    them all (a cutoff of 2**63 Å never returns)."""
    from ._ase import _check_cutoff
    cutoff = _check_cutoff(cutoff)
    if not pbc.any():
        return cutoff
    volume = abs(float(np.linalg.det(cell)))
    images = 1.0
    for axis in range(3):
        if not pbc[axis]:
            continue
        other = np.cross(cell[(axis + 1) % 3], cell[(axis + 2) % 3])
        height = volume / float(np.linalg.norm(other)) if volume > 0 else 0.0
        images *= 2 * math.ceil(cutoff / height) + 1 if height > 0 else math.inf
    if images > MAX_CUTOFF_IMAGES:
        raise ValueError(f"cutoff {cutoff} Å reaches {images:.3g} periodic images of the cell "
                         f"(at most {MAX_CUTOFF_IMAGES}); {len(atoms)} atoms")
    return cutoff


def _is_atoms(x: Any) -> bool:
    return hasattr(x, "get_positions") and hasattr(x, "get_atomic_numbers") and hasattr(x, "calc")


def _system_row(v: np.ndarray) -> np.ndarray:
    """One sample's value of a system field as a row: a scalar becomes (1,), a leading batch
    dimension of 1 is dropped ((1, 3, 3) -> (3, 3)), then nvalchemi's squeeze: while the stored
    array would have more than two dimensions and the first row dimension is 1, drop it."""
    v = np.asarray(v)
    if v.ndim == 0:
        return v.reshape(1)
    if v.ndim >= 2 and v.shape[0] == 1:
        v = v[0]
    while v.ndim >= 2 and v.shape[0] == 1:
        v = v[0]
    return v


class _Where:
    """Names a field of a block's samples in errors: ``sample 7 of this append: field forces``
    (the index counts the samples of the write or append call)."""

    def __init__(self, first: int, call: str, key: str) -> None:
        self.first, self.call, self.key = first, call, key

    def sample(self, i: int) -> str:
        return f"sample {self.first + i} of this {self.call}: field {self.key}"

    def same_shape(self, shapes: Sequence[tuple[int, ...]], what: str) -> None:
        """Every sample's `what` has the first sample's shape."""
        for i, got in enumerate(shapes):
            if got != shapes[0]:
                raise ValueError(f"{self.sample(i)}: {what} of shape {got}, sample "
                                 f"{self.first} has {shapes[0]}: every sample needs the same")

    def _bad(self, data: np.ndarray, bad: np.ndarray, counts: np.ndarray, why: str,
             per_sample: bool) -> ValueError:
        """The error for the first True of `bad` (over `data`'s elements): its sample and its
        index in the sample's value (rows first for atom and edge fields)."""
        k = int(np.argmax(bad.reshape(-1)))
        row_shape = data.shape[1:]
        row_elems = max(1, int(np.prod(row_shape, dtype=np.int64)))
        row = k // row_elems
        ends = np.cumsum(counts)
        i = int(np.searchsorted(ends, row, side="right"))
        at = [] if per_sample else [row - int(ends[i] - counts[i])]
        at += [int(j) for j in np.unravel_index(k % row_elems, row_shape)] if row_shape else []
        x = data.reshape(-1)[k]
        text = repr(float(x)) if data.dtype.kind == "f" else str(int(x))
        return ValueError(f"{self.sample(i)}: value {text} at {at} {why}")

    def cast(self, data: np.ndarray, dtype: np.dtype, counts: np.ndarray,
             per_sample: bool) -> np.ndarray:
        """`data` as `dtype`, exactly: non-finite floats are refused everywhere; a float stored
        as an integer must be integral and in range; an integer must fit its stored type; a bool
        must be 0 or 1; a float narrowed to float32/16 must stay finite."""
        if data.size == 0 or data.dtype == dtype:
            if data.dtype.kind == "f" and data.size and not np.isfinite(data).all():
                raise self._bad(data, ~np.isfinite(data), counts, "is not finite", per_sample)
            return np.ascontiguousarray(data, dtype=dtype)
        kind = data.dtype.kind
        if kind == "f":
            finite = np.isfinite(data)
            if dtype.kind in "iub":
                whole = np.where(finite, data == np.trunc(data), True)
                bad = ~finite | ~whole
                if bad.any():
                    k = int(np.argmax(bad.reshape(-1)))
                    why = ("is not finite" if not finite.reshape(-1)[k]
                           else "is not an integer")
                    raise self._bad(data, bad, counts, why, per_sample)
            elif not finite.all():
                raise self._bad(data, ~finite, counts, "is not finite", per_sample)
        if dtype.kind == "b" and kind in "iuf":
            bad = (data != 0) & (data != 1)
            if bad.any():
                raise self._bad(data, bad, counts, "is not a bool (0 or 1)", per_sample)
        elif dtype.kind in "iu" and kind in "iuf":
            info = np.iinfo(dtype)
            bad = (data < info.min) | (data > info.max)
            if bad.any():
                raise self._bad(data, bad, counts, f"does not fit {dtype.name}", per_sample)
        out = np.ascontiguousarray(data, dtype=dtype)
        if dtype.kind == "f" and kind == "f" and not np.isfinite(out).all():
            raise self._bad(data, ~np.isfinite(out), counts, f"does not fit {dtype.name}",
                            per_sample)
        return out


def _check_required_shapes(s: Mapping[str, np.ndarray], index: int, call: str) -> None:
    """positions [atoms, 3] and atomic_numbers [atoms], what every reader needs."""
    pos, z = s.get("positions"), s.get("atomic_numbers")
    if pos is not None and (pos.ndim != 2 or pos.shape[1] != 3):
        raise ValueError(f"sample {index} of this {call}: field positions: shape {pos.shape}; "
                         f"positions are [atoms, 3]")
    if z is not None and z.ndim != 1:
        raise ValueError(f"sample {index} of this {call}: field atomic_numbers: shape {z.shape}; "
                         f"atomic_numbers are [atoms]")


#: Arrays nvalchemi's AtomicData fills itself when a sample lacks them, so every store its
#: writer makes has them (FORMATS.md §8.1): an append to such a store fills them the same way.
_DERIVED = ("atomic_masses", "atom_categories", "velocities")


def _mass_table() -> np.ndarray:
    """periodictable's masses by atomic number 0..118 (0 is the neutron), float64: the table
    nvalchemi's AtomicData gathers atomic_masses from."""
    try:
        import periodictable
    except ImportError:
        raise ImportError("appending to a store with core/atomic_masses needs the masses: give "
                          "atomic_masses in each sample, or install periodictable (the table "
                          "nvalchemi fills them from)") from None
    return np.array([periodictable.elements[z].mass for z in range(119)], dtype=np.float64)


def _fill_derived(samples: list[dict[str, np.ndarray]],
                  schema: Mapping[str, tuple[str, str, np.dtype, tuple[int, ...]]], first: int,
                  call: str) -> None:
    """Adds the nvalchemi-derived arrays the store holds and a sample lacks, as AtomicData
    computes them: atomic_masses = masses[Z] in the positions' dtype, atom_categories zeros
    (int64), velocities zeros like positions."""
    want = [k for k in _DERIVED if schema.get(k, ("",))[0] == "core"]
    if not any(k not in s for s in samples for k in want):
        return
    table = _mass_table() if "atomic_masses" in want else None
    for i, s in enumerate(samples):
        if "positions" not in s or "atomic_numbers" not in s:
            continue  # the missing field is reported by the writer
        pos = s["positions"]
        fdt = pos.dtype if pos.dtype.kind == "f" else np.dtype(np.float32)
        if "atomic_masses" in want and "atomic_masses" not in s:
            z = np.asarray(s["atomic_numbers"])
            zi = _Where(first + i, call, "atomic_numbers").cast(
                z, np.dtype(np.int64), np.array([len(z)]), False)  # finite and integral
            if (zi < 0).any() or (zi > 118).any():
                raise ValueError(f"sample {first + i} of this {call}: field atomic_numbers: "
                                 f"{zi[(zi < 0) | (zi > 118)][0]} has no atomic mass "
                                 f"(atomic_masses is filled from the atomic numbers, 0..118)")
            s["atomic_masses"] = table[zi].astype(fdt)
        if "atom_categories" in want and "atom_categories" not in s:
            s["atom_categories"] = np.zeros(len(s["atomic_numbers"]), dtype=np.int64)
        if "velocities" in want and "velocities" not in s:
            s["velocities"] = np.zeros(np.shape(pos), dtype=fdt)


def _split_store_path(store: Union[str, os.PathLike]) -> tuple[str, str]:
    p = os.path.abspath(os.fspath(store))
    root, name = os.path.split(p)
    if not name:
        raise ValueError(f"{store!r}: a store needs a directory name")
    return root, name


class AtomicWriter:
    """Writes, appends to, deletes from and defragments an nvalchemi AtomicData store.

    Parameters
    ----------
    store : str or os.PathLike
        The store's directory (it is created by :meth:`write`), or an ``s3://bucket/prefix/name``
        URL.
    config : WriteConfig, dict or None
        Storage of new arrays (see :class:`WriteConfig`); appends keep each array's own.
    levels : dict, optional
        Levels (``"atom"``, ``"edge"``, ``"system"``) of custom keys. Without it a custom key is
        ``"atom"`` when its first dimension equals every sample's atom count, else ``"edge"``
        when it equals the edge count, else ``"system"``. Appends take the store's levels.
    float_dtype : numpy dtype, default float32
        The dtype of every floating-point core field (nvalchemi casts them to one dtype).
    cutoff : float, optional
        For ``ase.Atoms`` samples: build neighbor_list and shifts with this cutoff.
    block_size : int, default 4096
        Samples converted and handed to the writer at a time (memory stays bounded).
    storage_options : dict, optional
        For an ``s3://`` store: credentials, endpoint and tuning, as for :func:`zbatch.open`
        (docs/REMOTE.md). On S3 every object is one PUT (or an aborted-on-failure multipart
        upload) and the root ``zarr.json`` is written last, so a failed write leaves nothing
        that opens; :meth:`defragment` moves objects one by one there (S3 has no rename).

    Samples are dicts of arrays (``positions`` [n, 3], ``atomic_numbers`` [n], ``forces``,
    ``energy``, ``cell`` [3, 3], ``pbc`` [3], ``neighbor_list`` [e, 2] with per-sample 0-based
    indices, ``shifts`` [e, 3], any custom keys) or ``ase.Atoms``. Every sample of a store has
    the same keys.
    """

    def __init__(self, store: Union[str, os.PathLike], config: ConfigLike = None, *,
                 levels: Optional[Mapping[str, str]] = None, float_dtype: Any = np.float32,
                 cutoff: Optional[float] = None, block_size: int = 4096,
                 storage_options: Optional[Mapping[str, Any]] = None) -> None:
        self._remote = writable_options(os.fspath(store), storage_options)
        if self._remote is None:
            self.path = os.path.abspath(os.fspath(store))
            self._root, self._name = _split_store_path(store)
        else:
            self.path = os.fspath(store).rstrip("/")
            self._root, _, self._name = self.path.rpartition("/")
            if self._root.endswith(":/"):
                raise ValueError(f"{store!r}: an s3:// store needs a name below the bucket, "
                                 "e.g. s3://bucket/atoms.zarr")
        self.config = config
        self._config = _config_dict(config)
        self.levels = dict(levels or {})
        for k, v in self.levels.items():
            if v not in ("atom", "edge", "system"):
                raise ValueError(f"levels[{k!r}] = {v!r} is not 'atom', 'edge' or 'system'")
        self.float_dtype = np.dtype(float_dtype)
        self.cutoff = cutoff
        self.block_size = int(block_size)
        if self.block_size < 1:
            raise ValueError("block_size must be at least 1")

    def __repr__(self) -> str:
        return f"AtomicWriter({self.path!r})"

    # -- the store's objects, on disk or in a bucket ------------------------------------------

    def _has(self, key: str) -> bool:
        if self._remote is None:
            return os.path.exists(os.path.join(self.path, key))
        return _zbatch.store_read(self._root, self._remote, f"{self._name}/{key}") is not None

    def _read_json(self, key: str) -> Any:
        if self._remote is None:
            with open(os.path.join(self.path, key)) as f:
                return json.load(f)
        data = _zbatch.store_read(self._root, self._remote, f"{self._name}/{key}")
        if data is None:
            raise FileNotFoundError(f"{self.path}/{key}")
        return json.loads(data)

    def _children(self, prefix: str, dirs: bool) -> list[str]:
        """Names below ``prefix`` ("" = the store's parent): directories when ``dirs``, else
        every entry."""
        if self._remote is None:
            d = os.path.join(self.path, prefix) if prefix else self._root
            if not os.path.isdir(d):
                return []
            return sorted(e for e in os.listdir(d)
                          if not dirs or os.path.isdir(os.path.join(d, e)))
        where = f"{self._name}/{prefix}" if prefix else ""
        return sorted(n for n, is_dir in _zbatch.store_list(self._root, self._remote, where)
                      if is_dir or not dirs)

    def _exists_at_all(self) -> bool:
        if self._remote is None:
            return os.path.exists(self.path)
        return bool(_zbatch.store_list(self._root, self._remote, self._name))

    def _remove(self) -> None:
        if self._remote is None:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            _zbatch.store_remove_tree(self._root, self._remote, self._name)

    # -- writing -----------------------------------------------------------------------------

    def write(self, samples: Iterable[Any]) -> None:
        """Creates the store from ``samples`` (committed once, at the end).

        Raises ``FileExistsError`` if a store is already there.
        """
        if self._has("zarr.json"):
            raise FileExistsError(f"Zarr store already exists at {self.path}")
        if self._remote is None:
            os.makedirs(self._root, exist_ok=True)
        existed = self._exists_at_all()
        try:
            self._stream(samples, append=False)
        except BaseException:
            # a refused or failed write leaves nothing behind (the C writer's debris, a marked
            # incomplete store, is refused by readers but would still sit at the path)
            if not existed:
                self._remove()
            raise

    def append(self, samples: Iterable[Any]) -> None:
        """Appends ``samples``; they must have exactly the store's fields (core and custom), or
        nothing is written. Raises ``FileNotFoundError`` if there is no store."""
        if not self._has("zarr.json") and any(
                e.startswith(self._name + ".zbatch-") for e in self._children("", False)):
            self.recover()  # a defragment was interrupted: put the dataset back first
        if not self._has("zarr.json"):
            raise FileNotFoundError(f"Zarr store does not exist at {self.path}")
        self._stream(samples, append=True)

    def _stream(self, samples: Iterable[Any], append: bool) -> None:
        it = iter(samples)
        block = [s for _, s in zip(range(self.block_size), it)]
        if not block:
            if append:
                return  # nothing to append (as nvalchemi)
            raise ValueError("No data provided to write.")
        schema = self._store_schema() if append else None
        w = _zbatch.atomic_writer_open(self._root, self._name, append, self._config,
                                       self._remote)
        try:
            count = 0
            while block:
                self._add_block(w, block, count, schema, "append" if append else "write")
                count += len(block)
                block = [s for _, s in zip(range(self.block_size), it)]
            _zbatch.atomic_writer_commit(w)
        finally:
            _zbatch.atomic_writer_close(w)

    def _store_schema(self) -> dict[str, tuple[str, str, np.dtype, tuple[int, ...]]]:
        """name -> (group, level, dtype, row shape) of the store's arrays."""
        fields = self._read_json("zarr.json").get("attributes", {}).get("fields", {})
        out = {}
        for group in ("core", "custom"):
            for name in self._children(group, True):
                meta = f"{group}/{name}/zarr.json"
                if name.startswith(".") or not self._has(meta):
                    continue
                doc = self._read_json(meta)
                if doc.get("node_type") != "array":
                    continue
                level = fields.get(group, {}).get(name)
                if level is None:
                    level = _CORE_LEVELS.get(name, "atom") if group == "core" else "system"
                level = "atom" if level == "node" else level
                out[name] = (group, level, np.dtype(doc["data_type"]), tuple(doc["shape"][1:]))
        return out

    def _normalize(self, s: Any, index: int) -> dict[str, np.ndarray]:
        if _is_atoms(s):
            return sample_from_atoms(s, self.cutoff)
        if isinstance(s, Mapping):
            return {str(k): np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)
                    for k, v in s.items() if v is not None}
        raise TypeError(f"sample {index}: expected a dict or an ase.Atoms, got {type(s).__name__}")

    def _add_block(self, w: Any, block: Sequence[Any], first: int,
                   schema: Optional[dict[str, tuple[str, str, np.dtype, tuple[int, ...]]]],
                   call: str) -> None:
        """Validates a block of samples and hands it to the C writer: every value finite, each
        integral where the stored type is, shapes consistent; an error names the sample (its
        index in this write or append call) and the field, before anything is passed on."""
        samples = [self._normalize(s, first + i) for i, s in enumerate(block)]
        if schema is not None:
            _fill_derived(samples, schema, first, call)
        n = len(samples)
        keys = list(samples[0])
        for i, s in enumerate(samples[1:], 1):
            if set(s) != set(keys):
                raise ValueError(f"sample {first + i} has keys {sorted(s)}, sample {first} has "
                                 f"{sorted(keys)}: every sample needs the same fields")
        count_key = "atomic_numbers" if "atomic_numbers" in keys else "positions"
        if count_key not in keys:
            raise ValueError("a sample needs positions or atomic_numbers")
        for i, s in enumerate(samples):
            _check_required_shapes(s, first + i, call)
        atoms = np.array([len(s[count_key]) for s in samples], dtype=np.int64)
        edge_key = "neighbor_list" if "neighbor_list" in keys else next(
            (k for k in keys if _CORE_LEVELS.get(k) == "edge"), None)
        edges = np.array([len(s[edge_key]) if edge_key else 0 for s in samples], dtype=np.int64)
        fields = []
        for k in keys:
            row_shape = None
            if schema is not None and k in schema:
                group, level, dtype, row_shape = schema[k]
            else:
                group = "core" if k in _CORE_LEVELS else "custom"
                level = _CORE_LEVELS.get(k) or self.levels.get(k) or self._guess_level(
                    k, samples, atoms, edges)
                dtype = None
            where = _Where(first, call, k)
            if level == "system" and row_shape is not None:
                # appending: each value takes the stored row shape (a scalar for [N], ...)
                rows = []
                for i, s in enumerate(samples):
                    try:
                        rows.append(np.asarray(s[k]).reshape(row_shape))
                    except ValueError:
                        raise ValueError(f"{where.sample(i)}: shape {np.shape(s[k])} does not fit "
                                         f"the stored row shape {row_shape}") from None
                data = np.stack(rows)
                counts = np.ones(n, dtype=np.int64)
            elif level == "system":
                rows = [_system_row(s[k]) for s in samples]
                where.same_shape([r.shape for r in rows], "a value")
                data = np.stack(rows)
                counts = np.ones(n, dtype=np.int64)
            else:
                counts = atoms if level == "atom" else edges
                parts = [np.asarray(s[k]) for s in samples]
                for i, (a, m) in enumerate(zip(parts, counts)):
                    if a.ndim == 0 or a.shape[0] != m:
                        raise ValueError(f"sample {first + i}: {k} has shape {a.shape}, a "
                                         f"{level}-level field needs {m} rows")
                where.same_shape([a.shape[1:] for a in parts], "rows")
                data = np.concatenate(parts)
            if dtype is None:
                dtype = self._dtype_for(k, data.dtype)
            data = where.cast(data, np.dtype(dtype), counts, level == "system")
            if data.dtype.kind not in "biuf":
                raise TypeError(f"field {k}: dtype {data.dtype} cannot be stored")
            fields.append((group, k, level, data.dtype.name, tuple(data.shape[1:]), data))
        _zbatch.atomic_writer_add(w, n, atoms, edges if edge_key else None, fields)

    def _dtype_for(self, key: str, have: np.dtype) -> np.dtype:
        if key in _INT_KEYS:
            return np.dtype(_INT_KEYS[key])
        if key == "pbc":
            return np.dtype(bool)
        if key in _CORE_LEVELS and have.kind in "fiu" and key not in _INT_KEYS:
            return self.float_dtype  # nvalchemi casts every float core field to one dtype
        return have

    @staticmethod
    def _guess_level(key: str, samples: Sequence[dict[str, np.ndarray]], atoms: np.ndarray,
                     edges: np.ndarray) -> str:
        first = [np.asarray(s[key]).shape[0] if np.ndim(s[key]) else -1 for s in samples]
        if all(f == a for f, a in zip(first, atoms)):
            return "atom"
        if all(f == e for f, e in zip(first, edges)):
            return "edge"
        return "system"

    # -- store operations --------------------------------------------------------------------

    def delete(self, indices: Iterable[int]) -> None:
        """Soft-deletes samples by logical index (the i-th live sample). Only the masks change;
        the data stays until :meth:`defragment`."""
        ids = np.asarray(list(indices) if not hasattr(indices, "__array__") else indices)
        if ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0):
            raise IndexError("indices must be non-negative integers")
        _zbatch.atomic_delete(self._root, self._name,
                              np.ascontiguousarray(ids.reshape(-1), dtype=np.uint64).tobytes(),
                              self._remote)

    def defragment(self, config: ConfigLike = None) -> None:
        """Rewrites the store with only its live samples and swaps it in atomically. ``config``
        None keeps every array's codec and chunking."""
        try:
            _zbatch.atomic_defragment(self._root, self._name, _config_dict(config),
                                      self._remote)
        finally:
            if self._remote is None:
                self._prune_empty_siblings()

    def _prune_empty_siblings(self) -> None:
        # The file backend's erase removes files but not directories, so a removed old (or failed
        # new) store leaves its emptied directory tree behind; drop it when it holds no file.
        for entry in os.listdir(self._root):
            if not entry.startswith((self._name + ".zbatch-old", self._name + ".zbatch-new")):
                continue
            top = os.path.join(self._root, entry)
            if any(files for _, _, files in os.walk(top)):
                continue  # a real store (recovery decides about it), never removed here
            for dp, _dn, _fn in sorted(os.walk(top), key=lambda t: -len(t[0])):
                os.rmdir(dp)

    def add_custom(self, key: str, array: Any, level: str) -> None:
        """Adds the custom field ``key`` for every sample: ``array`` has num_samples rows
        (system), the store's atom count (atom) or edge count (edge)."""
        if level not in ("atom", "edge", "system"):
            raise ValueError(f"Invalid level '{level}'. Must be 'atom', 'edge', or 'system'.")
        a = np.asarray(array.detach().cpu().numpy() if hasattr(array, "detach") else array)
        if a.ndim == 0:
            raise ValueError("add_custom needs an array with a first (row) dimension")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            k = int(np.argmax(~np.isfinite(a).reshape(-1)))
            at = [int(j) for j in np.unravel_index(k, a.shape)]
            raise ValueError(f"field {key}: value {float(a.reshape(-1)[k])!r} at {at} is not "
                             f"finite")
        a = np.ascontiguousarray(a)
        _zbatch.atomic_add_custom(self._root, self._name, self._config,
                                  ("custom", key, level, a.dtype.name, tuple(a.shape[1:]), a),
                                  a.shape[0], self._remote)

    def check(self) -> dict[str, Any]:
        """The §8.2 invariants (ZbatchError ``ZB_E_CORRUPT`` naming the array if broken) and a
        summary: num_samples, num_live, num_atoms, num_edges, num_fields, uncommitted_tail."""
        return _zbatch.atomic_check(self._root, self._name, self._remote)

    def recover(self) -> None:
        """Repairs what a crash left (an interrupted append or defragment)."""
        _zbatch.atomic_recover(self._root, self._name, self._remote)
