"""Per-sample and per-batch transforms with nvalchemi's composition rules.

    >>> def shift(sample: dict, metadata):            # a sample transform
    ...     sample["positions"] = sample["positions"] + 1.0
    ...     return sample, metadata
    >>> ds = zbatch.Dataset(reader, transforms=[shift])
    >>> def center(batch: zbatch.Batch):              # a batch transform
    ...     return batch
    >>> loader = zbatch.DataLoader(ds, batch_transforms=[center])

The rules are nvalchemi 0.2.0's (``nvalchemi.data.transforms.Compose``):

- the kind of a callable comes from the annotation of its first positional parameter: a
  sample (``dict`` / ``Mapping`` here, nvalchemi's ``AtomicData``) makes a sample transform
  ``fn(sample, metadata) -> (sample, metadata)``; a batch (:class:`zbatch.Batch`, nvalchemi's
  ``Batch``) a batch transform ``fn(batch) -> batch``; any other annotation is a
  ``TypeError``; an unannotated callable takes the kind of the others;
- sample and batch transforms in one list are a ``TypeError`` naming both positions;
- they run left to right, each on what the one before returned (a transform returns its
  output; changing its input in place and returning None is not supported);
- an exception raised by a transform comes out as a ``RuntimeError`` naming its position,
  with the original exception as ``__cause__``.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence, get_origin, get_type_hints

__all__ = ["Compose", "transform_kind"]


def _nvalchemi(name: str) -> Any:
    """nvalchemi's class ``name`` when nvalchemi is loaded, else None (a callable annotated
    with one of its classes has loaded it: there is no need to import it, which is slow)."""
    mod = sys.modules.get("nvalchemi.data")
    return getattr(mod, name, None) if mod is not None else None


def _sample_types() -> tuple:
    return (dict, Mapping, _nvalchemi("AtomicData"))


def _batch_types() -> tuple:
    from .dataset import Batch
    return (Batch, _nvalchemi("Batch"))


def _first_annotation(fn: Callable) -> Any:
    """The resolved annotation of ``fn``'s first positional parameter, or None when it has
    none (nvalchemi's rule: a callable object's hints come from its ``__call__``)."""
    source: Any = fn
    if not (inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn)):
        source = getattr(type(fn), "__call__", fn)
    try:
        hints = get_type_hints(source)
    except Exception:  # unresolvable forward references count as no annotation (nvalchemi)
        hints = {}
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional:
        return None
    return hints.get(positional[0].name)


def transform_kind(fn: Callable, index: int = 0) -> Optional[str]:
    """``"sample"``, ``"batch"`` or None (no annotation) for one callable; TypeError for a
    callable whose first parameter is annotated with anything else, or a non-callable."""
    if not callable(fn):
        raise TypeError(f"Compose: transform at index {index} is not callable: got "
                        f"{type(fn).__name__}")
    ann = _first_annotation(fn)
    if ann is None:
        return None
    cls = get_origin(ann) or ann   # dict[str, np.ndarray] -> dict
    if cls in _batch_types():
        return "batch"
    if cls in _sample_types():
        return "sample"
    raise TypeError(f"Compose: transform at index {index} ({fn!r}) has typed first parameter "
                    f"{ann!r}; expected a sample (dict, Mapping or nvalchemi AtomicData: a "
                    "sample transform) or a batch (zbatch.Batch or nvalchemi Batch: a batch "
                    "transform)")


class Compose:
    """Transforms composed left to right, of one kind (see the module doc).

    ``Compose(transforms)(sample, metadata) -> (sample, metadata)`` for a sample composition,
    ``Compose(transforms)(batch) -> batch`` for a batch composition. ``is_batch`` is False
    for an empty or all-unannotated list (nvalchemi's default: sample semantics).
    """

    __slots__ = ("transforms", "is_batch", "kind", "system_keys", "_atomic")

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = tuple(transforms)
        kind, first = None, None
        #: which transforms take nvalchemi's AtomicData (their first parameter says so)
        self._atomic = tuple(_is_atomic_data(_first_annotation(fn)) if callable(fn) else False
                             for fn in self.transforms)
        #: the system-level keys of a sample (a leading dimension of 1 in an AtomicData)
        self.system_keys: frozenset = frozenset()
        for i, fn in enumerate(self.transforms):
            this = transform_kind(fn, i)
            if this is None:
                continue
            if kind is None:
                kind, first = this, i
            elif this != kind:
                raise TypeError(f"Compose: cannot mix sample and batch transforms; transform "
                                f"at index {first} is {kind!r} but transform at index {i} is "
                                f"{this!r}")
        #: "sample", "batch" or None (nothing annotated)
        self.kind = kind
        self.is_batch = kind == "batch"

    def __call__(self, data: Any, metadata: Any = None) -> Any:
        if self.is_batch:
            return self._run_batch(data)
        return self._run_sample(data, metadata)

    def _run_sample(self, data: Any, metadata: Any) -> tuple:
        as_dict = isinstance(data, Mapping)
        keys = frozenset(data) if as_dict else frozenset()
        for i, (fn, atomic) in enumerate(zip(self.transforms, self._atomic)):
            try:
                # a transform written for nvalchemi gets an AtomicData, the others a dict
                if atomic and isinstance(data, Mapping):
                    data = to_atomic_data(data, self.system_keys)
                elif not atomic and as_dict and not isinstance(data, Mapping) and \
                        _is_atomic_data(type(data)):
                    data = from_atomic_data(data, keys)
                data, metadata = fn(data, metadata)
            except Exception as e:
                raise RuntimeError(f"Compose: transform[{i}] ({fn!r}) raised "
                                   f"{type(e).__name__}") from e
        if as_dict and not isinstance(data, Mapping) and _is_atomic_data(type(data)):
            data = from_atomic_data(data, keys)
        return data, metadata

    def _run_batch(self, batch: Any) -> Any:
        for i, fn in enumerate(self.transforms):
            try:
                out = fn(batch)
            except Exception as e:
                raise RuntimeError(f"Compose: transform[{i}] ({fn!r}) raised "
                                   f"{type(e).__name__}") from e
            if out is None or not (isinstance(out, Mapping) or isinstance(out, type(batch))):
                # nvalchemi passes None on (the loop then yields None): zbatch stops here
                name = getattr(fn, "__qualname__", None) or repr(fn)
                raise TypeError(f"batch transform {name} returned {type(out).__name__}; a "
                                "batch transform must return the batch (a zbatch.Batch or a "
                                "dict of arrays)")
            batch = out
        return batch

    def __repr__(self) -> str:
        return f"Compose({list(self.transforms)!r})"


def _is_atomic_data(ann: Any) -> bool:
    return ann is not None and ann is _nvalchemi("AtomicData")


#: Arrays nvalchemi's AtomicData fills in itself; kept only when the sample had them.
_ATOMIC_DEFAULTS = frozenset({"atomic_masses", "atom_categories", "velocities"})


def to_atomic_data(sample: Mapping, system_keys: frozenset) -> Any:
    """A zbatch sample dict as nvalchemi's AtomicData (torch tensors; system fields with
    nvalchemi's leading dimension of 1)."""
    import numpy as np
    import torch
    from nvalchemi.data import AtomicData
    from ._atomic import SYSTEM_KEYS
    d = {}
    for k, v in sample.items():
        t = v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v))
        d[k] = t.unsqueeze(0) if k in SYSTEM_KEYS or k in system_keys else t
    return AtomicData.model_validate(d)


def from_atomic_data(data: Any, keys: frozenset) -> dict:
    """An AtomicData back as a sample dict of numpy arrays: the fields it holds, less the
    ones nvalchemi filled in itself that the sample did not have."""
    system = set(data.system_properties)
    out = {}
    for k, v in data:
        if not hasattr(v, "detach") or (k in _ATOMIC_DEFAULTS and k not in keys):
            continue   # None, info, AtomicData's bookkeeping (__node_keys__ ...)
        v = v.detach().cpu()
        out[k] = (v.squeeze(0) if k in system and v.ndim and v.shape[0] == 1 else v).numpy()
    return out


def check_sequence(transforms: Any, what: str) -> None:
    """nvalchemi's check: a list, not one callable or a generator."""
    if transforms is not None and not isinstance(transforms, Sequence):
        raise TypeError(f"{what} must be a Sequence of callables, not a single callable or "
                        "generator. Pass [fn] instead of fn.")
