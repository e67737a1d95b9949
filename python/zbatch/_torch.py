"""PyTorch interop: :func:`collate` for ``torch.utils.data.DataLoader`` over a
:class:`zbatch.Dataset`, and :class:`IterableLoader`, zbatch's pipeline as a
``torch.utils.data.IterableDataset`` split across torch workers and ranks.

    >>> ds = zbatch.open("atlas.zarr")
    >>> dl = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=2,
    ...                                  collate_fn=zbatch.collate)
    >>> it = zbatch.IterableLoader(ds, batch_size=4096, sampler="block", seed=0)
    >>> dl = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from .dataset import Dataset

__all__ = ["collate", "IterableLoader"]

try:  # the adapter is a torch IterableDataset when torch is there
    from torch.utils.data import IterableDataset as _IterableBase
except ImportError:  # pragma: no cover - torch is a dependency of the test environment
    _IterableBase = object


def collate(samples: Sequence[Mapping], output: str = "numpy") -> dict:
    """Builds a batch from sample dicts (``ds[i]``, as torch's DataLoader hands them to its
    ``collate_fn``): 1-row sparse matrices (``X``, layers) are stacked into one
    ``scipy.sparse.csr_matrix`` (``output="torch"``: a ``torch.sparse_csr_tensor``), scalars
    and equal-shape rows into arrays (strings: object arrays), ``index`` into an int64 array.
    Samples whose arrays differ in shape (atomic samples of different sizes) are refused:
    batch those with :meth:`Dataset.read_many` or :class:`zbatch.DataLoader`. A batch that is
    already a mapping (zbatch's own) is returned as it is."""
    import scipy.sparse as sp
    if output not in ("numpy", "scipy", "torch"):
        raise ValueError(f"output must be 'numpy', 'scipy' or 'torch', not {output!r}")
    if isinstance(samples, Mapping):
        return samples  # type: ignore[return-value]
    samples = list(samples)
    if not samples:
        raise ValueError("collate needs at least one sample")
    out: dict[str, Any] = {}
    for key in samples[0]:
        vals = [s[key] for s in samples]
        v0 = vals[0]
        if sp.issparse(v0):
            out[key] = sp.vstack(vals, format="csr")
            continue
        shapes = {np.shape(v) for v in vals}
        if len(shapes) > 1:
            raise ValueError(f"collate: field {key!r} has samples of different shapes "
                             f"{sorted(shapes)[:3]}; batch such samples with "
                             "Dataset.read_many or zbatch.DataLoader")
        if isinstance(v0, str):
            out[key] = np.array(vals, dtype=object)
        else:
            out[key] = np.stack([np.asarray(v) for v in vals])
    if output == "torch":
        import torch
        from .dataset import _csr
        for k, v in list(out.items()):
            if sp.issparse(v):
                out[k] = _csr(v.data, v.indices, v.indptr.astype(np.int64), v.shape, True)
            elif v.dtype != object:
                out[k] = torch.from_numpy(v.astype(np.int64) if v.dtype == np.uint64 else v)
    return out


class IterableLoader(_IterableBase):
    """zbatch's loader as a ``torch.utils.data.IterableDataset`` yielding whole batches, for
    code that insists on torch's DataLoader::

        >>> it = zbatch.IterableLoader(ds, batch_size=4096, sampler="random", seed=0)
        >>> for epoch in range(3):
        ...     it.set_epoch(epoch)
        ...     for b in torch.utils.data.DataLoader(it, batch_size=None, num_workers=2):
        ...         ...

    Every torch worker of every rank takes its own share of the epoch's global batches
    (worker ``w`` of ``W`` on rank ``r`` of ``R`` is part ``r * W + w`` of ``R * W``; ``rank``
    / ``world_size`` None resolve from torch.distributed, then RANK / WORLD_SIZE), so each id
    is read once per epoch across all of them. ``pad_or_drop=None`` (default) splits exactly
    (parts may differ by one batch); ``"pad"`` / ``"drop"`` give every part the same number of
    batches (repeating or dropping the tail, as zbatch's samplers do; what DDP needs).

    The order is a function of ``seed`` and the epoch: call :meth:`set_epoch` before each
    epoch (as with torch's DistributedSampler; worker processes get a copy of this object at
    each epoch, so a pass counter could not advance). Other keyword arguments go to
    :class:`zbatch.DataLoader` (``prefetch_factor``, ``num_threads``, ``output``,
    ``transforms``, sampler options such as ``block_size``...).
    """

    def __init__(self, dataset: Dataset, batch_size: int = 4096, sampler: str = "random",
                 seed: int = 0, *, rank: Optional[int] = None, world_size: Optional[int] = None,
                 pad_or_drop: Optional[str] = None, drop_last: bool = False, **loader_kwargs):
        if not isinstance(sampler, str):
            raise TypeError("IterableLoader takes a sampler name (its workers build their "
                            f"share of it), not {type(sampler).__name__}")
        if pad_or_drop not in (None, "pad", "drop"):
            raise ValueError(f"pad_or_drop must be None, 'pad' or 'drop', got {pad_or_drop!r}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.sampler = sampler
        self.seed = int(seed)
        self.rank, self.world_size = rank, world_size
        self.pad_or_drop = pad_or_drop
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._sampler_kw = {k: loader_kwargs.pop(k) for k in list(loader_kwargs)
                            if k not in _LOADER_ONLY}
        self._loader_kw = loader_kwargs

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next passes run (each epoch has its own order)."""
        if int(epoch) < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)

    def _part(self) -> tuple[int, int]:
        import torch.utils.data as tud
        from .loader import resolve_rank
        rank, world = resolve_rank(self.rank, self.world_size)
        info = tud.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * nw + wid, world * nw

    def _sampler(self, rank: int, world: int, pad_or_drop: str):
        from . import samplers as _samplers
        from .loader import _dataset_sampler_args
        kw = _dataset_sampler_args(self.dataset, self.sampler, self._sampler_kw)
        sm = _samplers.make_sampler(self.sampler, n=len(self.dataset),
                                    batch_size=self.batch_size, drop_last=self.drop_last,
                                    seed=self.seed, rank=rank, world_size=world,
                                    pad_or_drop=pad_or_drop, **kw)
        sm._set_epoch(self.epoch)
        return sm

    def __len__(self) -> int:
        """Batches of this process's share (all its workers together) per epoch."""
        part, parts = self._part()
        g = self._sampler(0, 1, "pad").epoch_batches
        if self.pad_or_drop == "pad":
            return -(-g // parts)
        if self.pad_or_drop == "drop":
            return g // parts
        return g // parts + (1 if part < g % parts else 0)

    def __iter__(self) -> Iterator:
        from .loader import DataLoader
        part, parts = self._part()
        self.dataset._check_process()
        mode = self.pad_or_drop or "drop"
        sm = self._sampler(part, parts, mode)
        loader = DataLoader(self.dataset, sampler=sm, **self._loader_kw)
        loader.set_epoch(self.epoch)
        yield from loader
        loader.close()
        if self.pad_or_drop is None:
            # the exact split: the tail of global batches that "drop" left out, one per part
            whole = self._sampler(0, 1, "pad")
            g = whole.epoch_batches
            tail = (g // parts) * parts + part
            if tail < g:
                whole._load_state_dict({"kind": whole.kind, "seed": whole.seed,
                                        "epoch": self.epoch, "position": tail})
                ids = next(iter(whole))
                yield loader._finish(self.dataset._read_raw(
                    np.ascontiguousarray(ids, dtype=np.uint64), loader._transforms))


#: DataLoader options that are not sampler options (everything else goes to the sampler)
_LOADER_ONLY = {"prefetch_factor", "num_threads", "output", "device", "pin_memory",
                "transforms", "batch_transforms", "depth", "collate_fn", "num_workers"}
