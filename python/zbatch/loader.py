"""The pipelined DataLoader: samplers in C, windows of batches read ahead on C threads, batches
in sampler order, exact resumption.

    >>> loader = zbatch.DataLoader(ds, batch_size=4096, sampler="block", seed=0,
    ...                            prefetch_factor=16, num_threads=2, output="torch")
    >>> for epoch in range(3):
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         ...
    >>> state = loader.state_dict(); loader.load_state_dict(state)
"""
from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from . import _zbatch
from .dataset import Batch, Dataset

_TRANSFORMS = ("log1p", "normalize_total", "densify", "cast")


def resolve_rank(rank: Optional[int], world_size: Optional[int]) -> tuple[int, int]:
    """rank and world size: explicit arguments, else torch.distributed when initialised, else
    the RANK / WORLD_SIZE environment variables, else 0 / 1."""
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
            return (int(rank) if rank is not None else r), (int(world_size) if world_size is not None else w)
    except ImportError:  # pragma: no cover - torch is a dependency of the test environment
        pass
    r = int(os.environ.get("RANK", 0)) if rank is None else int(rank)
    w = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else int(world_size)
    return r, w


def _transform_specs(transforms) -> list[tuple]:
    specs = []
    for t in transforms or ():
        if isinstance(t, str):
            t = (t,)
        elif isinstance(t, dict):
            t = (t["name"],) + tuple(v for k, v in t.items() if k != "name")
        t = tuple(t)
        if not t or t[0] not in _TRANSFORMS:
            raise ValueError(f"unknown transform {t!r}; built-ins are {_TRANSFORMS}")
        specs.append(t)
    return specs


class DataLoader:
    """Iterates batches of a :class:`zbatch.Dataset` in the order of a sampler.

    Parameters follow PyTorch's DataLoader where they overlap:
        batch_size, shuffle, drop_last, seed;
        sampler: a name ("sequential", "random", "block", "weighted", "size_aware", "multi") or
            a sampler object from :mod:`zbatch.samplers`; extra keyword arguments go to it
            (e.g. ``block_size=64, blocks_per_window=16`` for "block");
        prefetch_factor: batches per window (one coalesced read); depth: windows read ahead;
        num_threads: decode threads of the dataset (None keeps the dataset's);
        output: "numpy", "scipy" or "torch"; device / pin_memory: where torch batches go;
        rank / world_size: None resolves them from torch.distributed, then RANK/WORLD_SIZE;
        transforms: C transforms by name, run on the loader's worker thread: "log1p",
            ("normalize_total", target_sum), ("densify", columns_or_None), ("cast", field, dtype);
        batch_transforms: Python callables ``fn(batch) -> batch`` run in the consumer thread.
    """

    def __init__(self, dataset: Dataset, batch_size: int = 4096, shuffle: bool = False,
                 sampler: Union[str, Any, None] = None, seed: int = 0, prefetch_factor: int = 4,
                 num_threads: Optional[int] = None, drop_last: bool = False,
                 output: str = "numpy", device: str = "cpu", pin_memory: bool = False,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 transforms: Optional[Sequence] = None,
                 batch_transforms: Optional[Sequence[Callable]] = None, depth: int = 2,
                 **sampler_kwargs):
        from . import samplers as _samplers
        if output not in ("numpy", "scipy", "torch"):
            raise ValueError(f"output must be 'numpy', 'scipy' or 'torch', not {output!r}")
        if prefetch_factor < 1 or depth < 1:
            raise ValueError("prefetch_factor and depth must be >= 1")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.prefetch_factor = int(prefetch_factor)
        self.depth = int(depth)
        self.output = output
        self.device = device
        self.pin_memory = bool(pin_memory)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self._transforms = _transform_specs(transforms)
        self.batch_transforms = list(batch_transforms or ())
        if num_threads is not None:
            dataset.set_num_threads(int(num_threads))
        if sampler is None:
            sampler = "random" if shuffle else "sequential"
        if isinstance(sampler, str):
            sampler_kwargs = _dataset_sampler_args(dataset, sampler, sampler_kwargs)
            sampler = _samplers.make_sampler(sampler, n=len(dataset), batch_size=self.batch_size,
                                             drop_last=drop_last, seed=seed, rank=self.rank,
                                             world_size=self.world_size,
                                             **sampler_kwargs)
        elif sampler_kwargs:
            raise TypeError(f"sampler options {sorted(sampler_kwargs)} need a sampler name")
        self.sampler = sampler
        self._epoch = int(sampler._state_dict().get("epoch", 0))
        # the sampler's set_epoch / state_dict / load_state_dict are this loader's from now on
        # (its C state belongs to the worker threads while a C loader is alive)
        sampler._owner = weakref.ref(self)
        self._live: Optional[Any] = None
        # After a pass that ran to its end the C loader stays alive and reads on into the
        # epoch the next pass will most likely ask for (``_parked``): epoch + 1 once
        # set_epoch has been called, the same epoch again before that (PyTorch's loop without
        # set_epoch repeats the order). A pass over another epoch, a rewind or a loaded state
        # closes it and starts afresh, so the guess only decides how fast the next pass
        # starts, never what it yields. Reading on is bounded like any pass: at most `depth`
        # windows, whose memory the dataset's batch pool would keep anyway. Only a live C
        # loader is parked (close() and load_state_dict() clear _parked).
        self._parked: Optional[int] = None
        self._live_same = False
        self._epoch_set = False
        self._resume = False  # a loaded state: the next iteration continues from it

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` (also rewinds a partly consumed epoch). ``loader.sampler.
        set_epoch(epoch)`` does the same."""
        epoch = int(epoch)
        if epoch < 0:  # (checked before anything changes; the sampler checks it again)
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._epoch_set = True
        if self._parked == epoch:
            # the loader is already reading this epoch: keep what it has read
            self._epoch = epoch
            self._resume = False
            self.sampler._epoch = epoch
            return
        self.close()
        self._epoch = epoch
        self._resume = False
        self.sampler._set_epoch(epoch)

    def state_dict(self) -> dict:
        """The exact position: restoring it continues after the last batch handed out."""
        if self._live is not None:
            return {"kind": self.sampler.kind, **self._live.state()}
        return dict(self.sampler._state_dict())

    def load_state_dict(self, state: dict) -> None:
        """Restores a position: the next iteration continues right after it."""
        self.close()
        self.sampler._load_state_dict(state)
        self._epoch = int(state.get("epoch", self._epoch))
        self._resume = True

    def __iter__(self) -> Iterator[Batch]:
        """One pass over the current epoch, from its start (PyTorch's rule), or from the state
        given to :meth:`load_state_dict` just before."""
        if self._parked == self._epoch:
            loader = self._live  # read on from the pass before (see __init__)
        else:
            self.close()
            if not self._resume:
                self.sampler._set_epoch(self._epoch)
            self._live_same = not self._epoch_set
            loader = _zbatch._Loader(self.dataset._c, self.sampler._c, self.prefetch_factor,
                                     self.depth, self._transforms, more_epochs=-1,
                                     same_epoch=self._live_same)
            self._live = loader
        self._parked = None
        self._resume = False
        ended = False
        try:
            while True:
                raw = loader.next()
                if raw is None:
                    ended = True
                    break
                batch = Batch(raw, self.dataset.layout, self.dataset.n_vars, self.output)
                if self.output == "torch" and (self.device != "cpu" or self.pin_memory):
                    batch = _to_device(batch, self.device, self.pin_memory)
                for fn in self.batch_transforms:
                    batch = fn(batch)
                yield batch
        finally:
            if self._live is loader and ended:
                # the pass ran to its end: the loader reads on into the likely next epoch
                self._parked = self._epoch if self._live_same else self._epoch + 1
            elif self._live is loader:
                self.close()  # keeps the final position for state_dict
            else:
                loader.close()

    def close(self) -> None:
        """Stops the worker threads of an iteration in progress or of a loader reading on
        past the last pass (also on garbage collection); the position stays."""
        live, self._live = self._live, None
        self._parked = None
        if live is not None:
            state = live.state()
            live.close()
            self.sampler._load_state_dict(state)

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # noqa: D105
        try:
            self.close()
        except Exception:
            pass


_SIZE_SEGMENTS = {"num_atoms": ("max_atoms", "atoms"), "num_edges": ("max_edges", "edges"),
                  "nnz": ("max_nnz", "X")}


def _dataset_sampler_args(dataset: Dataset, name: str, kw: dict) -> dict:
    """Fills sampler arguments that come from the dataset: per-sample sizes for "size_aware"
    (from the pointer arrays, no values read) and class codes for "weighted" with
    ``class_field``."""
    kw = dict(kw)
    if name in ("size_aware", "size-aware"):
        for sizes_kw, (limit_kw, segment) in _SIZE_SEGMENTS.items():
            if kw.get(limit_kw) is not None and kw.get(sizes_kw) is None:
                kw[sizes_kw] = dataset.segment_lengths(segment)
    if name == "weighted" and "class_field" in kw:
        import numpy as np
        field = kw.pop("class_field")
        info = dataset.fields.get(field)
        if info is None or info["kind"] != "per_sample" or info["row_shape"] or \
                info["dtype"] == "string":
            raise ValueError(f"class_field {field!r} must be a per-sample scalar field")
        # every sample's class as batches carry it: a collection's codes in its one table, so
        # a label is one class across children; soft-deleted samples are not counted
        kw["class_codes"] = np.asarray(dataset.read_field(field), dtype=np.int64)
    return kw


def _to_device(batch: Batch, device: str, pin: bool) -> Batch:
    import torch
    batch._materialize()
    for k, v in list(batch._items.items()):
        if isinstance(v, torch.Tensor):
            if pin and not v.is_sparse and v.layout == torch.strided:
                v = v.pin_memory()
            batch._items[k] = v.to(device, non_blocking=pin)
    return batch
