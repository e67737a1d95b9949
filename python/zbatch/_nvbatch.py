"""Atomic batches for nvalchemi models, and a reader with nvalchemi's contract.

``output="nvalchemi"`` (``Dataset.read_many``, ``DataLoader``) turns one coalesced read into
an ``nvalchemi.data.Batch`` built straight from the batch's concatenated buffers: per-atom
and per-edge fields become the ``atoms`` / ``edges`` segmented groups (segment lengths from
the pointer arrays), per-sample fields the ``system`` group, and the neighbour list is the
batch's own (zbatch already adds each sample's atom offset, as nvalchemi's
``Batch.from_data_list`` does). Nothing is done per sample in Python. Without nvalchemi the
same buffers come as an :class:`AtomicBatch`, which offers the attributes nvalchemi models
read (``positions``, ``batch_idx``, ``batch_ptr``, ``num_graphs``, ``.to(device)``, ...).

:class:`AtomicReader` is nvalchemi's ``AtomicDataZarrReader`` contract over a zbatch dataset:
``reader[i]`` / ``read`` / ``read_many`` give ``(dict of tensors, metadata)`` pairs,
``get_metadata(i)`` ``(num_atoms, num_edges)``, ``refresh`` sees appends and deletes.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import numpy as np

#: field kinds of the C batch (zb_field_kind) and the nvalchemi level of each
_PER_SAMPLE, _RAGGED, _INDEX = 0, 1, 2
_GROUP_OF_SEGMENT = {"atoms": "atoms", "edges": "edges"}
_LEVEL_OF_GROUP = {"atoms": "atom", "edges": "edge", "system": "system"}
_KEYSET_OF_GROUP = {"atoms": "node", "edges": "edge", "system": "system"}


def nvalchemi_available() -> bool:
    """Whether ``nvalchemi.data.Batch`` can be imported (the output type then)."""
    try:
        from nvalchemi.data import Batch  # noqa: F401
    except ImportError:
        return False
    return True


def _groups(raw: dict) -> tuple[dict[str, dict], dict[str, np.ndarray]]:
    """The batch's fields as tensors by group ("atoms", "edges", "system") and its pointer
    arrays by segment, all sharing the C batch's memory."""
    import torch
    groups: dict[str, dict] = {}
    for name, (buf, typestr, shape, kind, seg) in raw["fields"].items():
        if isinstance(buf, list) or name.endswith("/mask"):
            continue  # strings and nullable masks have no nvalchemi level
        group = "system" if kind == _PER_SAMPLE else _GROUP_OF_SEGMENT.get(seg)
        if group is None:
            continue
        arr = np.frombuffer(buf, dtype=np.dtype(typestr)).reshape(shape)
        groups.setdefault(group, {})[name] = torch.from_numpy(arr)
    ptrs = {name: np.frombuffer(buf, dtype=np.int64) for name, buf in raw["segments"].items()}
    return groups, ptrs


def _lengths(ptr: np.ndarray):
    """Per-sample lengths of a pointer array as nvalchemi keeps them (int32)."""
    import torch
    return torch.from_numpy(np.diff(ptr).astype(np.int32))


def to_nvalchemi(raw: dict):
    """An ``nvalchemi.data.Batch`` over the buffers of a C batch (``Dataset._read_raw``)."""
    from nvalchemi.data import Batch
    from nvalchemi.data.level_storage import LevelSchema
    groups, ptrs = _groups(raw)
    schema = LevelSchema()
    build = _storage_builders()
    storages = {group: build[group](data, schema, ptrs.get(group))
                for group, data in groups.items()}
    storage = build["multi"](storages, schema)
    keys = {_KEYSET_OF_GROUP[g]: set(groups.get(g, {})) for g in ("atoms", "edges", "system")}
    return Batch._construct(device=_CPU[0], keys=keys, storage=storage)


_CPU: list = []
_BUILDERS: dict = {}


def _storage_builders() -> dict:
    """How the level storages of a batch are made. nvalchemi's constructors convert every
    tensor, validate shapes, build a TensorDict and move it to its device: two thirds of the
    time of a batch at 4,096 atoms. The fast builders set the same attributes on a bare object
    over a TensorDict made without checks (the tensors are already right); they are used only
    when they give an object with exactly the attributes the constructors give (checked
    once, on a one-atom batch), else the constructors are."""
    if _BUILDERS:
        return _BUILDERS
    import torch
    from nvalchemi.data.level_storage import (LevelSchema, MultiLevelStorage,
                                              SegmentedLevelStorage, UniformLevelStorage)
    from tensordict import TensorDict
    cpu = torch.device("cpu")
    _CPU.append(cpu)

    def slow_segmented(data, schema, ptr):
        return SegmentedLevelStorage(data=data, attr_map=schema, segment_lengths=_lengths(ptr),
                                     validate=False)

    def slow_uniform(data, schema, _ptr):
        return UniformLevelStorage(data=data, attr_map=schema, validate=False)

    def slow_multi(groups, schema):
        return MultiLevelStorage(groups=groups, attr_map=schema, validate=False)

    def bare(cls, data, schema):
        obj = cls.__new__(cls)
        rows = next(iter(data.values())).shape[0]
        obj.__dict__.update(_attr_map=schema, device=cpu, validate=False,
                            _data=TensorDict._new_unsafe(data, batch_size=torch.Size([rows]),
                                                         device=cpu))
        return obj

    def fast_segmented(data, schema, ptr):
        obj = bare(SegmentedLevelStorage, data, schema)
        obj.__dict__.update(segment_lengths=_lengths(ptr), _batch_idx=None, _batch_ptr=None,
                            _batch_ptr_np=None, _segment_indices=None)
        return obj

    def fast_uniform(data, schema, _ptr):
        return bare(UniformLevelStorage, data, schema)

    def fast_multi(groups, schema):
        obj = MultiLevelStorage.__new__(MultiLevelStorage)
        obj.__dict__.update(groups=groups, attr_map=schema, device=cpu)
        return obj

    one = {"x": torch.zeros(1, 3)}
    ptr = np.array([0, 1], dtype=np.int64)
    same = True
    for slow, fast in ((slow_segmented, fast_segmented), (slow_uniform, fast_uniform)):
        a, b = slow(dict(one), LevelSchema(), ptr), fast(dict(one), LevelSchema(), ptr)
        same &= type(a) is type(b) and set(vars(a)) == set(vars(b))
    a, b = slow_multi({}, LevelSchema()), fast_multi({}, LevelSchema())
    same &= set(vars(a)) == set(vars(b))
    if same:
        _BUILDERS.update(atoms=fast_segmented, edges=fast_segmented, system=fast_uniform,
                         multi=fast_multi)
    else:  # another nvalchemi: its own constructors
        _BUILDERS.update(atoms=slow_segmented, edges=slow_segmented, system=slow_uniform,
                         multi=slow_multi)
    return _BUILDERS


def to_atomic_batch(raw: dict) -> "AtomicBatch":
    """An :class:`AtomicBatch` over the buffers of a C batch."""
    groups, ptrs = _groups(raw)
    lengths = {g: _lengths(ptrs[g]) for g in ("atoms", "edges") if g in ptrs}
    return AtomicBatch(groups, lengths)


def convert(raw: dict):
    """The ``output="nvalchemi"`` batch of a C batch: nvalchemi's Batch when installed."""
    if nvalchemi_available():
        return to_nvalchemi(raw)
    return to_atomic_batch(raw)


class AtomicBatch:
    """A batch of atomic systems with the attributes of ``nvalchemi.data.Batch``, for
    ``output="nvalchemi"`` where nvalchemi is not installed: fields as attributes and items
    (``b.positions``, ``b["energy"]``), ``batch_idx`` (int32) / ``batch_ptr`` (int64), as
    nvalchemi's,
    ``num_graphs``, ``num_nodes``, ``num_edges``, ``num_nodes_list``, ``num_edges_list``,
    ``num_nodes_per_graph``, ``num_edges_per_graph``, ``keys``, ``to(device)``, ``cpu()``,
    ``cuda()``, ``pin_memory()``. Tensors set as attributes or items (``b["status"] = t``)
    join the group whose length their first dimension has (systems first)."""

    def __init__(self, groups: dict[str, dict], lengths: dict[str, Any], device: Any = "cpu"):
        import torch
        object.__setattr__(self, "_groups", {g: dict(v) for g, v in groups.items()})
        object.__setattr__(self, "_lengths", dict(lengths))
        object.__setattr__(self, "device", torch.device(device))
        object.__setattr__(self, "_derived", {})

    # -- sizes and pointers ----------------------------------------------------------------
    def _segment(self, group: str):
        import torch
        seg = self._lengths.get(group)
        return seg if seg is not None else torch.zeros(0, dtype=torch.int32, device=self.device)

    @property
    def num_graphs(self) -> int:
        for group in ("atoms", "edges"):
            if group in self._lengths:
                return int(self._lengths[group].shape[0])
        system = self._groups.get("system", {})
        return int(next(iter(system.values())).shape[0]) if system else 0

    batch_size = num_graphs

    @property
    def num_nodes(self) -> int:
        return int(self._segment("atoms").sum()) if "atoms" in self._groups else 0

    @property
    def num_edges(self) -> int:
        return int(self._segment("edges").sum()) if "edges" in self._groups else 0

    @property
    def num_nodes_per_graph(self):
        return self._segment("atoms")

    @property
    def num_edges_per_graph(self):
        return self._segment("edges")

    @property
    def num_nodes_list(self) -> list[int]:
        return self._segment("atoms").tolist()

    @property
    def num_edges_list(self) -> list[int]:
        return self._segment("edges").tolist()

    @property
    def batch_ptr(self):
        import torch
        if "batch_ptr" not in self._derived:
            seg = self._segment("atoms")   # int64, as nvalchemi's (a cumsum of int32)
            ptr = torch.zeros(seg.shape[0] + 1, dtype=torch.int64, device=self.device)
            torch.cumsum(seg, 0, out=ptr[1:])
            self._derived["batch_ptr"] = ptr
        return self._derived["batch_ptr"]

    @property
    def batch_idx(self):
        import torch
        if "batch_idx" not in self._derived:
            seg = self._segment("atoms")
            ids = torch.arange(seg.shape[0], dtype=torch.int32, device=self.device)
            self._derived["batch_idx"] = torch.repeat_interleave(ids, seg)
        return self._derived["batch_idx"]

    @property
    def keys(self) -> dict[str, set]:
        return {_KEYSET_OF_GROUP[g]: set(self._groups.get(g, {}))
                for g in ("atoms", "edges", "system")}

    # -- fields ----------------------------------------------------------------------------
    def _find(self, key: str):
        for data in self._groups.values():
            if key in data:
                return data[key]
        raise KeyError(key)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self._find(name)
        except KeyError:
            raise AttributeError(f"'AtomicBatch' object has no attribute {name!r} (fields: "
                                 f"{sorted(k for d in self._groups.values() for k in d)})"
                                 ) from None

    def __getitem__(self, key: str):
        return self._find(key)

    def __contains__(self, key: object) -> bool:
        return any(key in d for d in self._groups.values())

    def __iter__(self):
        for data in self._groups.values():
            yield from data.items()

    def __len__(self) -> int:
        return self.num_graphs

    def __setitem__(self, key: str, value) -> None:
        import torch
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"batch fields are tensors, got {type(value).__name__} for {key!r}")
        for data in self._groups.values():
            if key in data:
                data[key] = value
                return
        rows = int(value.shape[0]) if value.dim() else -1
        sizes = (("system", self.num_graphs), ("atoms", self.num_nodes),
                 ("edges", self.num_edges))
        for group, n in sizes:
            if rows == n:
                self._groups.setdefault(group, {})[key] = value
                return
        raise ValueError(f"field {key!r}: first dimension {rows} matches neither the "
                         f"{self.num_graphs} systems, the {self.num_nodes} atoms nor the "
                         f"{self.num_edges} edges of the batch")

    def __setattr__(self, name: str, value) -> None:
        import torch
        if isinstance(value, torch.Tensor):
            self[name] = value
        else:
            object.__setattr__(self, name, value)

    # -- devices ---------------------------------------------------------------------------
    def _map(self, fn, device) -> "AtomicBatch":
        groups = {g: {k: fn(v) for k, v in d.items()} for g, d in self._groups.items()}
        lengths = {g: fn(v) for g, v in self._lengths.items()}
        return AtomicBatch(groups, lengths, device)

    def to(self, device, dtype=None, non_blocking: bool = False) -> "AtomicBatch":
        """A copy on ``device`` (``dtype`` is ignored, as in nvalchemi)."""
        del dtype
        return self._map(lambda t: t.to(device, non_blocking=non_blocking), device)

    def cpu(self) -> "AtomicBatch":
        return self.to("cpu")

    def cuda(self, device: Optional[int] = None, non_blocking: bool = False) -> "AtomicBatch":
        return self.to("cuda" if device is None else f"cuda:{device}", non_blocking=non_blocking)

    def pin_memory(self) -> "AtomicBatch":
        return self._map(lambda t: t.pin_memory(), self.device)

    def __repr__(self) -> str:
        return (f"AtomicBatch({self.num_graphs} systems, {self.num_nodes} atoms, "
                f"{self.num_edges} edges; fields {sorted(k for k, _ in self)})")


# -- the reader ----------------------------------------------------------------------------

class AtomicReader:
    """nvalchemi's reader contract (``AtomicDataZarrReader``) over a zbatch atomic store.

    ``reader[i]`` and ``read(i)`` give one ``(data, metadata)`` pair: ``data`` maps field
    names to CPU tensors (per-atom fields ``[V_i, ...]``, per-edge fields ``[E_i, ...]`` with
    ``neighbor_list`` local to the sample, system fields ``[1, ...]``), ``metadata`` is
    ``{"index", "source_file", "physical_index"}`` as nvalchemi's. ``read_many(ids)`` gives
    the pairs in request order (duplicates allowed) from one coalesced read. Ids are logical
    (soft-deleted samples skipped); negative ids count from the end; out of range is an
    ``IndexError``. ``len(reader)`` is the number of live samples; ``get_metadata(i)`` is
    ``(num_atoms, num_edges)`` from the pointer arrays only; ``field_levels`` maps each field to
    ``"atom"``, ``"edge"`` or ``"system"``; ``refresh()`` re-reads the store (appends and deletes
    made since open); ``close()`` releases it (reads then raise ``RuntimeError``).

    It can stand where nvalchemi expects a reader (``nvalchemi.data.datapipes.Dataset(reader)``)
    and where a zbatch dataset is expected through ``reader.dataset``. Options go to
    :func:`zbatch.open` (``num_threads``, ``cache_bytes``).

        >>> reader = zbatch.AtomicReader("structures.zarr")
        >>> data, meta = reader[-1]
        >>> reader.get_metadata(0)
        (12, 96)
    """

    def __init__(self, store: Any, *, pin_memory: bool = False,
                 include_index_in_metadata: bool = True, **open_kwargs):
        from .dataset import Dataset, _store_path
        self._path = _store_path(store)
        self._open_kwargs = open_kwargs
        self.pin_memory = bool(pin_memory)
        self.include_index_in_metadata = bool(include_index_in_metadata)
        self._ds: Optional[Dataset] = None
        self.refresh(_first=True)

    @property
    def dataset(self):
        """The zbatch dataset read (for zbatch's samplers and DataLoader)."""
        return self._open()

    def _open(self):
        if self._ds is None:
            raise RuntimeError(f"{self._path}: the reader is closed")
        return self._ds

    def refresh(self, _first: bool = False) -> None:
        """Re-reads the store's pointer arrays, samples mask and fields, so that samples
        appended or deleted since the reader was opened are seen."""
        from .dataset import Dataset
        if not _first and self._ds is None:
            raise RuntimeError(f"{self._path}: cannot refresh a closed reader")
        ds = Dataset(self._path, **self._open_kwargs)
        if ds.layout != "atomic":
            raise ValueError(f"{self._path}: AtomicReader reads atomic stores, this one's "
                             f"layout is {ds.layout!r}")
        self._ds = ds
        self._physical: Optional[np.ndarray] = None
        self._sizes: Optional[tuple[np.ndarray, np.ndarray]] = None

    def close(self) -> None:
        """Releases the store; later reads raise RuntimeError."""
        self._ds = None

    def __enter__(self) -> "AtomicReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._open())

    def __repr__(self) -> str:
        state = f"len={len(self)}" if self._ds is not None else "closed"
        return f"zbatch.AtomicReader({self._path!r}, {state})"

    @property
    def field_levels(self) -> dict[str, str]:
        """Field name -> ``"atom"``, ``"edge"`` or ``"system"``."""
        out = {}
        for name, info in self._open().fields.items():
            if info["kind"] == "per_sample":
                out[name] = "system"
            elif info.get("segment") in _GROUP_OF_SEGMENT:
                out[name] = _LEVEL_OF_GROUP[_GROUP_OF_SEGMENT[info["segment"]]]
        return out

    @property
    def field_names(self) -> list[str]:
        return list(self.field_levels)

    def _resolve(self, ids: Sequence[int]) -> np.ndarray:
        n = len(self)
        arr = np.asarray(ids.numpy() if hasattr(ids, "numpy") else ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise TypeError(f"sample ids must be a 1-d sequence of integers, got {ids!r}")
        arr = arr.astype(np.int64, copy=False)
        arr = np.where(arr < 0, arr + n, arr)
        bad = (arr < 0) | (arr >= n)
        if bad.any():
            k = int(np.argmax(bad))
            raise IndexError(f"Index {int(ids[k])} out of range for reader with {n} samples")
        return arr

    def _physical_ids(self) -> np.ndarray:
        """The physical sample of every logical id (the live rows of samples_mask)."""
        if self._physical is None:
            from . import read_array
            mask = read_array(self._path, "meta/samples_mask") if os.path.isdir(
                os.path.join(self._path, "meta", "samples_mask")) else None
            n = len(self)
            self._physical = (np.flatnonzero(mask)[:n] if mask is not None
                              else np.arange(n, dtype=np.int64))
        return self._physical

    def get_metadata(self, index: int) -> tuple[int, int]:
        """``(num_atoms, num_edges)`` of sample ``index`` (pointer arrays only)."""
        i = int(self._resolve([index])[0])
        if self._sizes is None:   # read once per open: samplers call this for every id
            ds = self._open()
            atoms = ds.segment_lengths("atoms")
            edges = ds.segment_lengths("edges") if "edges" in _segments(ds) else \
                np.zeros(len(atoms), dtype=np.uint64)
            self._sizes = (atoms, edges)
        return int(self._sizes[0][i]), int(self._sizes[1][i])

    def read_many(self, indices: Sequence[int]) -> list[tuple[dict, dict]]:
        """``(data, metadata)`` of every id, in request order (one coalesced read)."""
        import torch
        ids = self._resolve(indices)
        if not len(ids):
            return []
        per_sample = _split(self._open()._read_raw(ids.astype(np.uint64)))
        phys = self._physical_ids()
        out = []
        for d, i in zip(per_sample, ids.tolist()):
            # nvalchemi's zarr reader names the index whatever include_index_in_metadata says
            meta = {"index": i, "source_file": self._path, "physical_index": str(int(phys[i]))}
            if self.pin_memory:
                d = {key: v.pin_memory() for key, v in d.items()}
            out.append((d, meta))
        return out

    def read(self, index: int) -> tuple[dict, dict]:
        """``(data, metadata)`` of one sample."""
        return self.read_many([index])[0]

    def __getitem__(self, index: int) -> tuple[dict, dict]:
        return self.read(index)

    def __iter__(self):
        for i in range(len(self)):
            yield self.read(i)


def _split(raw: dict) -> list[dict]:
    """The samples of a C batch as nvalchemi's reader gives them: one dict of tensor views
    per sample, system fields ``[1, ...]``, neighbour lists local to their sample."""
    import torch
    groups, ptrs = _groups(raw)
    n = len(np.frombuffer(raw["index"], dtype=np.uint64))
    per_sample: list[dict] = [{} for _ in range(n)]
    nat = np.diff(ptrs["atoms"]).tolist() if "atoms" in ptrs else None
    ned = np.diff(ptrs["edges"]).tolist() if "edges" in ptrs else None
    for group, data in groups.items():
        for name, t in data.items():
            if group == "system":
                parts = torch.split(t, 1)
            elif group == "atoms":
                parts = torch.split(t, nat)
            else:
                if name == "neighbor_list":   # back to indices local to each sample
                    start = torch.from_numpy(np.repeat(ptrs["atoms"][:-1], ned))
                    t = t - start.reshape(-1, *([1] * (t.dim() - 1)))
                parts = torch.split(t, ned)
            for d, p in zip(per_sample, parts):
                d[name] = p
    return per_sample


def _segments(ds) -> set[str]:
    return {info["segment"] for info in ds.fields.values() if info.get("segment")}


# -- GPU memory --------------------------------------------------------------------------

#: bytes of device memory budgeted per atom of a batch by :func:`estimate_max_atoms` (the
#: batch's own fields and a model's per-atom activations; nvalchemi's heuristic uses 300)
BYTES_PER_ATOM = 300


def estimate_max_atoms(device: Any = "cuda", *, free_bytes: Optional[int] = None,
                       fraction: float = 0.8, bytes_per_atom: int = BYTES_PER_ATOM) -> int:
    """A per-batch atom limit from the free memory of ``device``:
    ``int(free * fraction) // bytes_per_atom`` (at least 1). ``free_bytes`` overrides the
    figure read from ``torch.cuda.mem_get_info(device)``. Raises ValueError for a device that
    is not a CUDA device, or when CUDA is not available."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if int(bytes_per_atom) < 1:
        raise ValueError(f"bytes_per_atom must be >= 1, got {bytes_per_atom}")
    if free_bytes is None:
        import torch
        dev = torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"max_atoms=None estimates a limit from free GPU memory, but "
                             f"batches go to {str(dev)!r}: give max_atoms (or "
                             "max_batch_size), or device='cuda'")
        if not torch.cuda.is_available():
            raise ValueError(f"max_atoms=None estimates a limit from the free memory of "
                             f"{str(dev)!r}, but torch.cuda.is_available() is False: give "
                             "max_atoms")
        free_bytes, _total = torch.cuda.mem_get_info(dev)
    return max(int(int(free_bytes) * fraction) // int(bytes_per_atom), 1)


# -- dynamics: nvalchemi's inflight batching ----------------------------------------------

class DynamicsPool:
    """The pool of :meth:`SizeAwareSampler.build_initial_batch` / ``request_replacement``:
    samples binned by ``num_atoms // bin_width`` (dataset order within a bin), each handed out
    once, with a running ``system_id``, as nvalchemi's ``SizeAwareSampler`` does."""

    def __init__(self, dataset: Any, num_atoms: np.ndarray, num_edges: np.ndarray,
                 max_atoms: Optional[int], max_edges: Optional[int],
                 max_batch_size: Optional[int], bin_width: int):
        self.dataset = dataset
        self.num_atoms = np.asarray(num_atoms, dtype=np.int64)
        self.num_edges = np.asarray(num_edges, dtype=np.int64)
        self.max_atoms, self.max_edges = max_atoms, max_edges
        self.max_batch_size = max_batch_size
        self.consumed = np.zeros(len(self.num_atoms), dtype=bool)
        self.next_system_id = 0
        bins = self.num_atoms // int(bin_width)
        order = np.argsort(bins, kind="stable")
        keys, starts = np.unique(bins[order], return_index=True)
        #: bin key -> ids of the bin in dataset order
        self.bins = dict(zip(keys.tolist(), np.split(order, starts[1:])))
        self.bin_width = int(bin_width)

    @property
    def exhausted(self) -> bool:
        return bool(self.consumed.all())

    def _zbatch_dataset(self):
        ds = getattr(self.dataset, "dataset", self.dataset)
        return ds if hasattr(ds, "_read_raw") else None

    def _stamp(self, count: int):
        import torch
        ids = torch.arange(self.next_system_id, self.next_system_id + count,
                           dtype=torch.long).reshape(count, 1)
        self.next_system_id += count
        return ids

    def build_initial_batch(self):
        import torch
        limit_n = self.max_batch_size if self.max_batch_size is not None else float("inf")
        chosen: list[int] = []
        atoms = edges = 0
        active = sorted(self.bins)
        while active and len(chosen) < limit_n:
            still, added = [], False
            for key in active:
                if len(chosen) >= limit_n:
                    break
                members = self.bins[key]
                free = members[~self.consumed[members]]
                if not len(free):
                    continue
                fits = np.ones(len(free), dtype=bool)
                if self.max_atoms is not None:
                    fits &= atoms + self.num_atoms[free] <= self.max_atoms
                if self.max_edges is not None:
                    fits &= edges + self.num_edges[free] <= self.max_edges
                if fits.any():
                    i = int(free[np.argmax(fits)])
                    chosen.append(i)
                    self.consumed[i] = True
                    atoms += int(self.num_atoms[i])
                    edges += int(self.num_edges[i])
                    added = True
                    if len(free) > 1:
                        still.append(key)
                else:
                    still.append(key)
            if not added:
                break
            active = still
        if not chosen:
            raise RuntimeError("Cannot build initial batch: no samples available or "
                               "constraints too tight.")
        batch = self._read_batch(chosen)
        batch["status"] = torch.zeros(len(chosen), 1, dtype=torch.long)
        return batch

    def _read_batch(self, ids: list[int]):
        ds = self._zbatch_dataset()
        if ds is None:
            from nvalchemi.data import Batch
            samples = [self._sample(i) for i in ids]
            return Batch.from_data_list(samples)
        raw = ds._read_raw(np.ascontiguousarray(ids, dtype=np.uint64))
        batch = convert(raw)
        stamp = self._stamp(len(ids))
        if hasattr(batch, "_storage"):  # nvalchemi's Batch: a system field, listed in keys
            batch["system_id"] = stamp
            batch.keys["system"].add("system_id")
        else:
            batch["system_id"] = stamp
        return batch

    def _sample(self, i: int):
        ds = self._zbatch_dataset()
        if ds is not None:
            data = _split(ds._read_raw(np.array([i], dtype=np.uint64)))[0]
        else:
            data = self.dataset[i][0]
        stamp = self._stamp(1)
        try:
            from nvalchemi.data import AtomicData
        except ImportError:
            if isinstance(data, dict):
                data["system_id"] = stamp
            return data
        if isinstance(data, dict):
            data = AtomicData.model_validate(data)
        data.add_system_property("system_id", stamp)
        return data

    def request_replacement(self, num_atoms: Optional[int], num_edges: Optional[int]):
        room_a = np.iinfo(np.int64).max if num_atoms is None else int(num_atoms)
        room_e = np.iinfo(np.int64).max if num_edges is None else int(num_edges)
        if room_a < 0 or room_e < 0:
            raise ValueError("room must be >= 0")
        top = room_a // self.bin_width
        for key in sorted((k for k in self.bins if k <= top), reverse=True):
            members = self.bins[key]
            ok = (~self.consumed[members] & (self.num_atoms[members] <= room_a)
                  & (self.num_edges[members] <= room_e))
            if ok.any():
                i = int(members[np.argmax(ok)])
                self.consumed[i] = True
                return self._sample(i)
        return None
