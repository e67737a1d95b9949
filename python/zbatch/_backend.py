"""Datasets over a reader: a custom backend (any object with ``read_many(ids)`` and
``__len__``: an HDF5 file, an LMDB, a folder of files) or a zbatch dataset, with per-sample
transforms.

    >>> ds = zbatch.Dataset(H5Reader("train.h5"), transforms=[shift])
    >>> loader = zbatch.DataLoader(ds, sampler="size_aware", max_atoms=4096)

``reader.read_many(ids)`` returns one entry per requested id, in request order: a dict of
arrays (numpy, torch or anything ``numpy.asarray`` takes) or nvalchemi's ``(dict,
metadata)`` pair. The loader calls it on its prefetch threads (Python threads; a bounded
number of batches in flight; batches in sampler order), applies the per-sample transforms
there, and collates the samples as zbatch's atomic batches are collated: atom- and
edge-level fields concatenated, ``neighbor_list`` offset by the atoms before each sample,
system fields stacked, ``atoms_ptr`` / ``edges_ptr`` / ``batch_idx`` built from the counts.

Levels of the fields: the reader's ``field_levels`` (nvalchemi's attribute: name ->
``"atom"`` / ``"node"``, ``"edge"`` or ``"system"``), else nvalchemi's AtomicData key sets
for known names, else guessed once from the first sample read (first dimension equal to its
atom count: atom, to its edge count: edge, else system).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ._atomic import _CORE_LEVELS
from .dataset import Batch, Dataset, MultiDataset, sample_dict
from .transforms import Compose, check_sequence

#: Edge fields whose values are atom indices local to the sample, offset when collated
#: (the native atomic layout's index field).
_INDEX_FIELDS = frozenset({"neighbor_list"})
_SEGMENTS = {"atom": "atoms", "edge": "edges"}
_NO_STATS = {"chunks_decoded": 0, "chunks_cached": 0, "chunks_filled": 0, "bytes_fetched": 0,
             "bytes_decoded": 0, "bytes_delivered": 0, "range_reads": 0}


def is_reader(obj: Any) -> bool:
    """True for what ``zbatch.Dataset(obj, ...)`` wraps instead of opening as a path."""
    if isinstance(obj, (str, bytes, os.PathLike)):
        return False
    return isinstance(obj, Dataset) or (hasattr(obj, "read_many") and hasattr(obj, "__len__"))


def _ids_text(ids: Sequence[int]) -> str:
    ids = [int(i) for i in ids]
    return str(ids) if len(ids) <= 16 else f"{ids[:16]}[:16] of {len(ids)}"


def _as_array(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):  # a torch tensor
        v = v.detach().cpu().numpy()
    return np.asarray(v)


class ReaderDataset(Dataset):
    """``zbatch.Dataset(reader, transforms=[...])``: a dataset over a reader (see the module
    doc). ``reader`` is a zbatch dataset or any object with ``read_many(ids)`` and
    ``__len__``.

    ``transforms``: zbatch's C transforms by name first (``"log1p"``, ``("cast", field,
    dtype)``, ...; zbatch datasets only: they run on the C worker threads), then Python
    per-sample callables ``fn(sample: dict, metadata: dict) -> (sample, metadata)`` composed
    with nvalchemi's rules (:mod:`zbatch.transforms`), run on the loader's prefetch threads.
    A sample is a dict of numpy arrays (edge indices local to the sample); metadata holds
    the reader's metadata and ``"index"``, the sample id.
    ``num_workers``: prefetch threads of a :class:`zbatch.DataLoader` over this dataset.
    """

    def __init__(self, reader: Any, *, transforms: Optional[Sequence] = None,
                 num_workers: int = 2, field_levels: Optional[Mapping[str, str]] = None):
        check_sequence(transforms, "transforms")
        specs: list = []
        calls: list[Callable] = []
        for i, t in enumerate(transforms or ()):
            if isinstance(t, (str, tuple, dict)):
                if calls:
                    raise ValueError(f"transforms[{i}] {t!r}: zbatch's C transforms run in C "
                                     "before any Python transform, so they come first")
                specs.append(t)
            else:
                calls.append(t)
        native = reader if isinstance(reader, Dataset) else None
        if specs and native is None:
            raise ValueError(f"transforms {specs!r}: C transforms run on a zbatch dataset's "
                             f"reads; {type(reader).__name__} is read in Python")
        compose = Compose(calls)
        if compose.is_batch:
            raise TypeError("Dataset transforms are per-sample (fn(sample, metadata)); a batch "
                            "transform goes in DataLoader(batch_transforms=[...])")
        if int(num_workers) < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        from .loader import _transform_specs
        self.reader = reader
        self._native = native
        self._c_transforms = _transform_specs(specs)
        self._compose = compose if calls else None
        self._prefetch_workers = int(num_workers)
        self._levels: dict[str, str] = {}
        for k, v in dict(field_levels or getattr(reader, "field_levels", None) or {}).items():
            self._levels[str(k)] = "atom" if v == "node" else str(v)
        #: True when batches are collated in Python (a custom backend or Python transforms)
        self._python_pipeline = native is None or self._compose is not None
        if native is not None:
            self._c = native._c
            self.layout, self.n_vars, self.path = native.layout, native.n_vars, native.path
            self.name = native.name
        else:
            self.layout, self.n_vars = "atomic", 0
            self.path = self.name = getattr(reader, "path", None) or type(reader).__name__
        self._frames = {}
        self._sizes: dict[str, np.ndarray] = {}
        self._fields: Optional[dict] = None

    def __reduce__(self):
        return (_rebuild, (self.reader, self._c_transforms + list(
            self._compose.transforms if self._compose else ()), self._prefetch_workers,
            self._levels))

    def __repr__(self) -> str:
        return f"zbatch.Dataset({self.reader!r}, n={len(self)})"

    def __len__(self) -> int:
        return len(self.reader)

    def _check_process(self) -> None:
        if self._native is not None:
            self._native._check_process()
            self._c = self._native._c

    def set_num_threads(self, n: int) -> None:
        """Prefetch threads of a loader (and, over a zbatch dataset, its decode threads)."""
        if self._native is not None:
            self._native.set_num_threads(n)
        self._prefetch_workers = int(n)

    @property
    def fields(self) -> dict:
        """Field name -> dict(kind, dtype, row_shape, segment, target), as zbatch datasets
        describe theirs (from the first sample, for a custom backend)."""
        if self._native is not None and self._compose is None:
            return self._native.fields
        if self._fields is None:
            b = self.read_many([0] if len(self) else [])
            self._fields = {}
            for k, e in b._raw["fields"].items():
                self._fields[k] = dict(kind=e[3], dtype=np.dtype(e[1]).name,
                                       row_shape=tuple(e[2][1:]), segment=e[4],
                                       target="atoms" if e[3] == "index" else None)
        return self._fields

    # -- reading -------------------------------------------------------------------------------
    def read_many(self, ids: Sequence[int], output: str = "numpy") -> Batch:
        """The samples ``ids`` (any order, duplicates allowed) collated into one Batch."""
        if output not in ("numpy", "scipy", "torch"):
            raise ValueError(f"output must be 'numpy', 'scipy' or 'torch', not {output!r}")
        from .loader import _ids_array
        return Batch(self._read_raw(_ids_array(ids, len(self))), self.layout, self.n_vars,
                     output)

    def _read_raw(self, ids: np.ndarray, transforms: Sequence = ()) -> dict:
        """The raw batch of validated uint64 ids (what the C reader returns), the loader's C
        transforms ``transforms`` included; runs on the loader's prefetch threads."""
        if self._native is not None and self._compose is None:
            return self._native._read_raw(ids, list(self._c_transforms) + list(transforms))
        samples, _ = self._samples(ids, transforms)
        return self._collate(samples, ids)

    def _samples(self, ids: np.ndarray, transforms: Sequence = ()) -> tuple[list, list]:
        """The samples ``ids`` as dicts of arrays (edge indices local) and their metadata,
        transformed."""
        if self._native is not None:
            raw = self._native._read_raw(ids, list(self._c_transforms) + list(transforms))
            b = Batch(raw, self.layout, self.n_vars, "numpy")
            samples = [sample_dict(self._native, b, k) for k in range(b.size)]
            for s in samples:
                s.pop("index", None)
            metas: list[dict] = [{} for _ in samples]
        else:
            if transforms:
                raise ValueError(f"DataLoader transforms {list(transforms)!r}: C transforms "
                                 "run on zbatch datasets; this one reads through "
                                 f"{type(self.reader).__name__}")
            samples, metas = self._read_backend(ids)
        if self._compose is not None:
            self._compose.system_keys = self._system_keys()
            for k, i in enumerate(ids):
                metas[k] = {**(metas[k] or {}), "index": int(i)}
                samples[k], metas[k] = self._compose(samples[k], metas[k])
                if not isinstance(samples[k], Mapping):
                    raise TypeError(f"sample {int(i)}: a sample transform returned "
                                    f"{type(samples[k]).__name__}; it must return (dict of "
                                    "arrays, metadata)")
        return samples, metas

    def _system_keys(self) -> frozenset:
        if self._native is not None:
            return frozenset(k for k, f in self._native.fields.items()
                             if f["kind"] == "per_sample")
        return frozenset(k for k, v in self._levels.items() if v == "system")

    def _read_backend(self, ids: np.ndarray) -> tuple[list, list]:
        want = [int(i) for i in ids]
        name = type(self.reader).__name__
        try:
            out = list(self.reader.read_many(want))
        except Exception as e:
            raise RuntimeError(f"{name}.read_many failed for sample ids {_ids_text(want)}: "
                               f"{type(e).__name__}: {e}") from e
        if len(out) != len(want):
            raise ValueError(f"{name}.read_many returned {len(out)} samples for "
                             f"{len(want)} ids {_ids_text(want)}")
        samples, metas = [], []
        for i, item in zip(want, out):
            meta = None
            if isinstance(item, tuple) and len(item) == 2:
                item, meta = item
            if not isinstance(item, Mapping):
                raise TypeError(f"{name}.read_many: sample {i} is a {type(item).__name__}, "
                                "not a dict of arrays")
            samples.append({str(k): v for k, v in item.items() if v is not None})
            metas.append(dict(meta) if isinstance(meta, Mapping) else {})
        return samples, metas

    # -- collation ----------------------------------------------------------------------------
    def _level(self, key: str, first: dict, atoms: int, edges: Optional[int]) -> str:
        level = self._levels.get(key) or _CORE_LEVELS.get(key)
        if level is None:
            v = first[key]
            n = v.shape[0] if v.ndim else -1
            level = "atom" if n == atoms else "edge" if edges is not None and n == edges \
                else "system"
            self._levels[key] = level
        return level

    def _collate(self, samples: list, ids: np.ndarray) -> dict:
        raw: dict[str, Any] = {"index": np.ascontiguousarray(ids, dtype=np.uint64),
                               "segments": {}, "fields": {}, "stats": dict(_NO_STATS)}
        children = self._children_of(ids)
        if children is not None:
            raw["dataset"] = children
        if not samples:
            raw["segments"]["atoms"] = np.zeros(1, dtype=np.int64)
            return raw
        samples = [{k: _as_array(v) for k, v in s.items()} for s in samples]
        keys = list(samples[0])
        for s, i in zip(samples, ids):
            if set(s) != set(keys):
                diff = sorted(set(s) ^ set(keys))
                raise ValueError(f"sample {int(i)} has fields {sorted(s)}, sample {int(ids[0])} "
                                 f"has {sorted(keys)}: field {diff[0]!r} is not in both")
        count = "atomic_numbers" if "atomic_numbers" in keys else "positions"
        if count not in keys:
            raise ValueError(f"sample {int(ids[0])}: a sample needs positions or "
                             "atomic_numbers (its atom count)")
        first = samples[0]
        edge_key = "neighbor_list" if "neighbor_list" in keys else next(
            (k for k in keys if (self._levels.get(k) or _CORE_LEVELS.get(k)) == "edge"), None)
        natoms = np.array([len(s[count]) for s in samples], dtype=np.int64)
        nedges = np.array([len(s[edge_key]) for s in samples], dtype=np.int64) \
            if edge_key else None
        levels = {k: self._level(k, first, int(natoms[0]),
                                 None if nedges is None else int(nedges[0])) for k in keys}
        ptrs = {"atoms": np.concatenate([[0], np.cumsum(natoms)]).astype(np.int64)}
        counts = {"atoms": natoms}
        if nedges is not None or any(v == "edge" for v in levels.values()):
            if nedges is None:
                raise ValueError(f"edge fields {[k for k, v in levels.items() if v == 'edge']}"
                                 " without neighbor_list: zbatch needs it for the edge count")
            ptrs["edges"] = np.concatenate([[0], np.cumsum(nedges)]).astype(np.int64)
            counts["edges"] = nedges
        raw["segments"] = ptrs
        for k in keys:
            raw["fields"][k] = self._field(k, levels[k], samples, ids, counts, ptrs)
        return raw

    def _field(self, k: str, level: str, samples: list, ids: np.ndarray, counts: dict,
               ptrs: dict) -> tuple:
        parts = [s[k] for s in samples]
        if level == "system":
            parts = [p.reshape(1) if p.ndim == 0 else p for p in parts]
            shape = parts[0].shape
            for p, i in zip(parts, ids):
                if p.shape != shape:
                    raise ValueError(f"sample {int(i)}: system field {k!r} has shape "
                                     f"{p.shape}, sample {int(ids[0])} has {shape}")
            arr, kind, seg = np.stack(parts), "per_sample", None
        else:
            seg = _SEGMENTS[level]
            for p, i, n in zip(parts, ids, counts[seg]):
                if p.ndim == 0 or p.shape[0] != n or p.shape[1:] != parts[0].shape[1:]:
                    raise ValueError(f"sample {int(i)}: {level} field {k!r} has shape "
                                     f"{p.shape}; {n} rows of {parts[0].shape[1:]} expected")
            arr, kind = np.concatenate(parts), "ragged"
            if k in _INDEX_FIELDS and seg == "edges":
                offsets = np.repeat(ptrs["atoms"][:-1], counts["edges"])
                arr = arr + offsets.reshape((-1,) + (1,) * (arr.ndim - 1)).astype(arr.dtype)
                kind = "index"
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"sample {int(ids[0])}: field {k!r} has dtype {arr.dtype}; zbatch "
                            "batches hold booleans, integers and floats")
        arr = np.ascontiguousarray(arr)
        return (arr, arr.dtype.str, arr.shape, kind, seg)

    def _children_of(self, ids: np.ndarray) -> Optional[np.ndarray]:
        return None

    # -- sizes for the size-aware sampler ----------------------------------------------------
    def segment_lengths(self, segment: str) -> np.ndarray:
        """Per-sample atom or edge counts: the reader's ``get_metadata(i) -> (num_atoms,
        num_edges)`` when it has one (nvalchemi's contract), else counted from its samples
        (read once, in blocks, and kept)."""
        if self._native is not None:
            return self._native.segment_lengths(segment)
        if segment not in ("atoms", "edges"):
            raise ValueError(f"segment {segment!r}: a reader dataset has 'atoms' and 'edges'")
        if segment not in self._sizes:
            self._count_sizes()
        return self._sizes[segment]

    def _count_sizes(self) -> None:
        n = len(self)
        atoms = np.zeros(n, dtype=np.uint64)
        edges = np.zeros(n, dtype=np.uint64)
        meta = getattr(self.reader, "get_metadata", None)
        if meta is not None:
            for i in range(n):
                atoms[i], edges[i] = meta(i)
        else:
            for start in range(0, n, 1024):
                ids = np.arange(start, min(n, start + 1024), dtype=np.uint64)
                samples, _ = self._read_backend(ids)
                raw = self._collate(samples, ids)
                for seg, out in (("atoms", atoms), ("edges", edges)):
                    if seg in raw["segments"]:
                        out[start:start + len(ids)] = np.diff(raw["segments"][seg])
        self._sizes = {"atoms": atoms, "edges": edges}


def _rebuild(reader, transforms, workers, levels) -> ReaderDataset:
    return ReaderDataset(reader, transforms=transforms, num_workers=workers,
                         field_levels=levels)


def _field_names(ds: Dataset) -> set:
    return set(ds.fields) if len(ds) else set()


def check_same_fields(children: Sequence[Dataset]) -> None:
    """output_strict: every non-empty child has the same field names (nvalchemi's rule),
    else ZB_E_INVALID naming the field and the two children."""
    from . import _error
    ref = next((k for k, d in enumerate(children) if len(d)), None)
    if ref is None:
        return
    want = _field_names(children[ref])
    for k, d in enumerate(children):
        have = _field_names(d)
        if not len(d) or have == want:
            continue
        f = sorted(want ^ have)[0]
        where, missing = (ref, k) if f in want else (k, ref)
        raise _error("ZB_E_INVALID", f"MultiDataset: field {f!r} is in dataset {where} "
                     f"({children[where].name}) but not in dataset {missing} "
                     f"({children[missing].name}); output_strict=False keeps the fields "
                     "common to all children")


def needs_python_multi(children: list, output_strict: bool) -> bool:
    """Whether a MultiDataset of these children is read in Python: a child that is read in
    Python, or children with different fields when output_strict is False."""
    if any(getattr(d, "_python_pipeline", False) or not isinstance(d, Dataset)
           for d in children):
        return True
    if output_strict or not children:
        return False
    names = [_field_names(d) for d in children if len(d)]
    return any(n != names[0] for n in names)


class MultiReaderDataset(ReaderDataset, MultiDataset):
    """A MultiDataset read in Python (see MultiDataset): children's samples in one index
    space, ``b["dataset"]`` the child of each sample; with ``output_strict=False`` only the
    fields common to every non-empty child."""

    def __init__(self, datasets: Sequence[Any], *, output_strict: bool = True,
                 num_workers: int = 2, **_c_options: Any):
        kids = [d if isinstance(d, ReaderDataset) else ReaderDataset(d) for d in datasets]
        if not kids:
            raise ValueError("MultiDataset needs at least one dataset")
        if output_strict:
            check_same_fields(kids)
        names = [_field_names(d) for d in kids if len(d)]
        self._common = set.intersection(*names) if names else set()
        self.children = list(datasets)
        self._kids = kids
        #: the length of every child, in order (the "multi" sampler's ``sizes``)
        self.sizes = [len(d) for d in kids]
        self._offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.output_strict = bool(output_strict)
        levels = {}
        for d in kids:
            levels.update(d._levels)
        ReaderDataset.__init__(self, _Children(self), num_workers=num_workers,
                               field_levels=levels)
        self.path = self.name = kids[0].name

    def __repr__(self) -> str:
        return f"zbatch.MultiDataset({len(self._kids)} datasets, n={len(self)})"

    def __reduce__(self):
        return (_rebuild_multi, (self.children, self.output_strict, self._prefetch_workers))

    def _children_of(self, ids: np.ndarray) -> np.ndarray:
        return (np.searchsorted(self._offsets, ids.astype(np.int64), side="right") - 1
                ).astype(np.int32)

    def segment_lengths(self, segment: str) -> np.ndarray:
        return np.concatenate([np.asarray(d.segment_lengths(segment), dtype=np.uint64)
                               for d in self._kids])


class _Children:
    """The read_many of a MultiReaderDataset: each child reads its own samples (one read per
    child), answered in request order."""

    def __init__(self, multi: MultiReaderDataset):
        self.multi = multi

    def __len__(self) -> int:
        return int(self.multi._offsets[-1])

    def read_many(self, ids: Sequence[int]) -> list:
        m = self.multi
        ids = np.asarray(ids, dtype=np.int64)
        child = m._children_of(ids)
        out: list = [None] * len(ids)
        for k in np.unique(child):
            at = np.flatnonzero(child == k)
            local = (ids[at] - m._offsets[k]).astype(np.uint64)
            samples, metas = m._kids[k]._samples(local)
            for j, s, meta in zip(at, samples, metas):
                out[j] = ({f: v for f, v in s.items() if f in m._common},
                          {**meta, "dataset": int(k)})
        return out


def _rebuild_multi(children, strict, workers) -> MultiDataset:
    return MultiDataset(children, output_strict=strict, num_workers=workers)
