"""Samplers: which samples go in which batch, for which rank and epoch.

Every sampler here is a thin wrapper over a C sampler of libzbatch (``zbatch_sampler.h``), and
its order is a pure function of ``(seed, epoch, rank, world_size, position)``: the state a
checkpoint needs is three numbers, and restoring it continues exactly where the run stopped,
also on another number of ranks.

Iterating a sampler yields one numpy ``int64`` array of sample ids per batch::

    >>> s = zbatch.samplers.RandomSampler(10, batch_size=4, seed=0)
    >>> [b.tolist() for b in s]            # doctest: +SKIP
    [[7, 2, 9, 0], [4, 1, 8, 5], [3, 6]]
    >>> s.set_epoch(1)                     # another permutation

Distributed training: every epoch is one sequence of *global* batches, the same for any world
size; rank ``r`` of ``W`` takes global batches ``r, r + W, r + 2W, ...``. All ranks get the
same number of batches: ``pad_or_drop="pad"`` (default) repeats batches from the start of the
epoch on the last ranks, ``"drop"`` drops the tail. ``rank`` / ``world_size`` given explicitly
win; otherwise they come from ``torch.distributed`` when it is initialised, else from the
``RANK`` / ``WORLD_SIZE`` environment variables, else 0 / 1.

``state_dict()["position"]`` counts *global* batches consumed (the same on every rank), so a
job stopped on 4 ranks can resume on 3 with no batch of the epoch repeated or skipped.

The DataLoader takes either one of these objects or a name for :func:`make_sampler`; C code
reaches the underlying ``zb_sampler`` through the ``_c`` attribute.
"""
from __future__ import annotations

import numbers as _numbers
import os
import sys
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as _np

from . import _zbatch

__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "BlockSampler", "WeightedSampler",
           "SizeAwareSampler", "MultiDatasetSampler", "MultiDatasetBatchSampler", "make_sampler",
           "resolve_rank_world"]

_POLICIES = {"dataset_size": 0, "min_size": 1, "max_size": 2}
_U64_MAX = (1 << 64) - 1


def resolve_rank_world(rank: Optional[int] = None,
                       world_size: Optional[int] = None) -> tuple[int, int]:
    """The ``(rank, world_size)`` a sampler uses.

    Explicit arguments win (a missing one is completed from the same source as below, or
    0 / 1). Otherwise: ``torch.distributed`` when it is available and initialised, else the
    ``RANK`` and ``WORLD_SIZE`` environment variables (as ``torchrun`` sets them), else
    ``(0, 1)``.
    """
    if rank is None or world_size is None:
        src_rank, src_world = _environment_rank_world()
        if rank is None:
            rank = src_rank if world_size is None or world_size == src_world else 0
        if world_size is None:
            world_size = src_world
    rank, world_size = int(rank), int(world_size)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return rank, world_size


def _environment_rank_world() -> tuple[int, int]:
    # torch.distributed can only be initialised if torch was imported: don't import it here
    torch = sys.modules.get("torch")
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    r, w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if r is not None and w is not None:
        try:
            return int(r), int(w)
        except ValueError:
            raise ValueError(f"RANK={r!r} / WORLD_SIZE={w!r} are not integers") from None
    return 0, 1


def _pad_flag(pad_or_drop: str) -> bool:
    if pad_or_drop not in ("pad", "drop"):
        raise ValueError(f"pad_or_drop must be 'pad' or 'drop', got {pad_or_drop!r}")
    return pad_or_drop == "drop"


def _u64(a, name: str) -> Optional[_np.ndarray]:
    if a is None:
        return None
    arr = _np.asarray(a)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-d, got shape {arr.shape}")
    if arr.size and arr.dtype.kind == "i" and arr.min() < 0:
        raise ValueError(f"{name} must be >= 0")
    if arr.dtype.kind not in "iub":
        raise TypeError(f"{name} must hold integers, got {arr.dtype}")
    return _np.ascontiguousarray(arr, dtype=_np.uint64)


def _f64(a, name: str) -> Optional[_np.ndarray]:
    if a is None:
        return None
    arr = _np.ascontiguousarray(a, dtype=_np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-d, got shape {arr.shape}")
    return arr


class Sampler:
    """Base class of the zbatch samplers: iteration, ``len``, epochs and exact resume.

    ``iter(sampler)`` runs the current epoch from its start, except right after
    :meth:`load_state_dict`, when it continues from the restored position. ``len(sampler)``
    is this rank's number of batches per epoch.
    """

    kind: str = ""

    def __new__(cls, *args, **kwargs):
        # the constructor's arguments, kept to build an independent copy (_clone): a second
        # live iterator of a DataLoader runs its own C pipeline over its own C sampler
        obj = super().__new__(cls)
        obj._init_args = (args, dict(kwargs))
        return obj

    def _clone(self) -> "Sampler":
        """An independent sampler of the same kind, options, rank and world size, at this
        sampler's seed and epoch (as last set from Python), position 0."""
        args, kwargs = getattr(self, "_init_args", ((), {}))
        kwargs = {**kwargs, "rank": self._rank, "world_size": self._world_size}
        twin = type(self)(*args, **kwargs)
        # (not this sampler's C state: a loader's worker threads may be using it)
        twin._c.restore(self._seed & _U64_MAX, self._epoch, 0)
        twin._seed, twin._epoch = self._seed, self._epoch
        return twin

    def __init__(self, c: Any, *, seed: int, rank: int, world_size: int, batch_size: int):
        self._c = c
        self._seed = int(seed)
        self._epoch = 0
        self._rank = rank
        self._world_size = world_size
        self._batch_size = int(batch_size)
        self._pristine = True   # at the start of the epoch, nothing taken yet
        self._resume = False    # load_state_dict was called since the last pass
        # The DataLoader that drives this sampler (a weak reference, set by the loader): its
        # worker threads draw from the C sampler, so epochs and states go through it
        self._owner: Optional[Any] = None

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[_np.ndarray]:
        if not (self._pristine or self._resume):
            self._c.set_epoch(self._epoch)
        self._pristine = self._resume = False
        nxt = self._c.next
        while True:
            buf = nxt()
            if buf is None:
                return
            yield _np.frombuffer(buf, dtype=_np.int64)

    def __len__(self) -> int:
        return int(self._c.num_batches())

    # -- epochs and state ------------------------------------------------------------------
    def _driver(self) -> Optional[Any]:
        return self._owner() if self._owner is not None else None

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next pass runs (each epoch has its own order). On the
        sampler of a :class:`zbatch.DataLoader` this is the loader's ``set_epoch`` (PyTorch's
        ``loader.sampler.set_epoch(epoch)`` idiom)."""
        loader = self._driver()
        if loader is not None:
            loader.set_epoch(epoch)
        else:
            self._set_epoch(epoch)

    def _set_epoch(self, epoch: int) -> None:
        epoch = int(epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._c.set_epoch(epoch)
        self._epoch = epoch
        self._pristine, self._resume = True, False

    def state_dict(self) -> dict[str, Any]:
        """``{"kind", "seed", "epoch", "position"}``; position counts global batches. On the
        sampler of a :class:`zbatch.DataLoader`: the loader's position (after the last batch
        it handed out, not the ones it read ahead)."""
        loader = self._driver()
        return loader.state_dict() if loader is not None else self._state_dict()

    def _state_dict(self) -> dict[str, Any]:
        seed, epoch, position = self._c.get_state()
        return {"kind": self.kind, "seed": int(seed), "epoch": int(epoch),
                "position": int(position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from ``state`` (possibly saved with another world size): the next pass
        starts at its position. On the sampler of a :class:`zbatch.DataLoader` this is the
        loader's ``load_state_dict``."""
        loader = self._driver()
        if loader is not None:
            loader.load_state_dict(state)
        else:
            self._load_state_dict(state)

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        kind = state.get("kind", self.kind)
        if kind != self.kind:
            raise ValueError(f"state of a {kind!r} sampler given to a {self.kind!r} sampler")
        self._c.restore(int(state["seed"]), int(state["epoch"]), int(state["position"]))
        self._seed = int(state["seed"])
        self._epoch = int(state["epoch"])
        self._pristine, self._resume = False, True

    # -- properties ------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def batch_size(self) -> int:
        """Samples per batch (the maximum, for size-aware samplers)."""
        return self._batch_size

    @property
    def num_samples(self) -> int:
        """The dataset length the ids index into."""
        return int(self._c.length())

    @property
    def remaining(self) -> int:
        """Batches this rank still yields in the current epoch."""
        return int(self._c.remaining())

    @property
    def epoch_batches(self) -> int:
        """Global batches of the epoch (all ranks, before padding or dropping)."""
        return int(self._c.epoch_batches())

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(n={self.num_samples}, batch_size={self.batch_size}, "
                f"seed={self.seed}, rank={self.rank}, world_size={self.world_size}, "
                f"epoch={self.epoch})")


def _base(n, batch_size, drop_last, seed, rank, world_size, pad_or_drop):
    rank, world_size = resolve_rank_world(rank, world_size)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if int(n) < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    kw = dict(n=int(n), batch_size=int(batch_size), drop_last=bool(drop_last),
              seed=int(seed) & _U64_MAX, rank=rank, world_size=world_size,
              drop=_pad_flag(pad_or_drop))
    return kw, rank, world_size


class SequentialSampler(Sampler):
    """Ids ``0 .. n-1`` in order, in batches of ``batch_size``.

    Example::

        >>> [b.tolist() for b in SequentialSampler(5, batch_size=2)]
        [[0, 1], [2, 3], [4]]
    """

    kind = "sequential"

    def __init__(self, n: int, batch_size: int = 1, drop_last: bool = False, *,
                 seed: int = 0, rank: Optional[int] = None, world_size: Optional[int] = None,
                 pad_or_drop: str = "pad"):
        kw, rank, world_size = _base(n, batch_size, drop_last, seed, rank, world_size,
                                     pad_or_drop)
        super().__init__(_zbatch.sampler_sequential(**kw), seed=seed, rank=rank,
                         world_size=world_size, batch_size=batch_size)


class RandomSampler(Sampler):
    """A full random permutation of ``0 .. n-1`` per epoch, without replacement.

    The permutation is a keyed bijection (a Feistel network with cycle walking), so memory is
    O(1) for any ``n`` (even 10^12) and construction is instant.
    """

    kind = "random"

    def __init__(self, n: int, batch_size: int = 1, drop_last: bool = False, *,
                 seed: int = 0, rank: Optional[int] = None, world_size: Optional[int] = None,
                 pad_or_drop: str = "pad"):
        kw, rank, world_size = _base(n, batch_size, drop_last, seed, rank, world_size,
                                     pad_or_drop)
        super().__init__(_zbatch.sampler_random(**kw), seed=seed, rank=rank,
                         world_size=world_size, batch_size=batch_size)


class BlockSampler(Sampler):
    """Shuffled blocks of contiguous rows, loaded and shuffled a window at a time.

    Rows are cut into blocks of ``block_size``; the block order is a random permutation per
    epoch (a short last block, when ``n`` is not a multiple, always comes last, so every window
    but the last has ``blocks_per_window * block_size`` rows); ``blocks_per_window``
    consecutive blocks of that order form a window whose rows are permuted; batches are cut in
    order from the window stream. Reads stay contiguous (read amplification ~1) while batches
    mix ``blocks_per_window`` blocks.

    Peers: annbatch ``Loader(chunk_size=c, preload_nchunks=p)`` is ``block_size=c,
    blocks_per_window=p`` (:meth:`from_annbatch`); scDataset ``BlockShuffling(block_size=b)``
    with ``fetch_factor=f`` is ``block_size=b, blocks_per_window=ceil(f * batch_size / b)``
    (:meth:`from_scdataset`).
    """

    kind = "block"

    def __init__(self, n: int, batch_size: int = 1, block_size: int = 256,
                 blocks_per_window: int = 16, drop_last: bool = False, *, seed: int = 0,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 pad_or_drop: str = "pad"):
        kw, rank, world_size = _base(n, batch_size, drop_last, seed, rank, world_size,
                                     pad_or_drop)
        self.block_size = int(block_size)
        self.blocks_per_window = int(blocks_per_window)
        if self.block_size < 1 or self.blocks_per_window < 1:
            raise ValueError("block_size and blocks_per_window must be >= 1")
        c = _zbatch.sampler_block(block_size=self.block_size,
                                  blocks_per_window=self.blocks_per_window, **kw)
        super().__init__(c, seed=seed, rank=rank, world_size=world_size,
                         batch_size=batch_size)

    @classmethod
    def from_annbatch(cls, n: int, chunk_size: int = 512, preload_nchunks: int = 32,
                      batch_size: int = 1, **kwargs) -> "BlockSampler":
        """annbatch's ``chunk_size`` / ``preload_nchunks`` as block size / blocks per window."""
        return cls(n, batch_size, block_size=chunk_size, blocks_per_window=preload_nchunks,
                   **kwargs)

    @classmethod
    def from_scdataset(cls, n: int, block_size: int = 4, fetch_factor: int = 16,
                       batch_size: int = 1, **kwargs) -> "BlockSampler":
        """scDataset's ``block_size`` / ``fetch_factor``: a window holds the
        ``fetch_factor * batch_size`` rows scDataset fetches at once."""
        bpw = max(1, -(-int(fetch_factor) * int(batch_size) // int(block_size)))
        return cls(n, batch_size, block_size=block_size, blocks_per_window=bpw, **kwargs)


class WeightedSampler(Sampler):
    """``num_samples`` draws per epoch with replacement, by weight or class-balanced.

    Give ``weights`` (one per sample; like ``torch.utils.data.WeightedRandomSampler``) or
    ``class_codes`` (categorical codes per sample, e.g. ``obs["cell_type"].cat.codes``; a
    pandas Categorical is accepted; negative codes are never drawn). With class codes each
    class gets ``class_weights[c]`` (default 1: class-balanced) shared by its members.
    ``block_size`` > 0 draws in runs of ``block_draws`` rows from one block of contiguous rows
    (read locality) with the same per-draw probabilities.

    Example::

        >>> s = WeightedSampler([1.0, 0.0, 3.0], batch_size=4, num_samples=8, seed=1)
        >>> len(s), 1 in _np.concatenate(list(s))   # id 1 has weight 0
        (2, False)
    """

    kind = "weighted"

    def __init__(self, weights: Optional[Sequence[float]] = None, batch_size: int = 1,
                 num_samples: Optional[int] = None, *, class_codes=None,
                 class_weights: Optional[Sequence[float]] = None, replacement: bool = True,
                 block_size: int = 0, block_draws: Optional[int] = None,
                 drop_last: bool = False, seed: int = 0, rank: Optional[int] = None,
                 world_size: Optional[int] = None, pad_or_drop: str = "pad"):
        if not replacement:
            raise ValueError("WeightedSampler draws with replacement; use RandomSampler or "
                             "MultiDatasetSampler(replacement=False) for draws without")
        if (weights is None) == (class_codes is None):
            raise ValueError("give exactly one of weights and class_codes")
        w = codes = None
        if weights is not None:
            w = _f64(weights, "weights")
            n = len(w)
        else:
            if hasattr(class_codes, "codes"):   # pandas Categorical / Series.cat
                class_codes = class_codes.codes
            codes = _np.ascontiguousarray(class_codes, dtype=_np.int64)
            if codes.ndim != 1:
                raise ValueError("class_codes must be 1-d")
            n = len(codes)
        if num_samples is not None and int(num_samples) < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        kw, rank, world_size = _base(n, batch_size, drop_last, seed, rank, world_size,
                                     pad_or_drop)
        c = _zbatch.sampler_weighted(weights=w, class_codes=codes,
                                     class_weights=_f64(class_weights, "class_weights"),
                                     num_samples=int(num_samples or 0),
                                     block_size=int(block_size),
                                     block_draws=int(block_draws or 0), **kw)
        super().__init__(c, seed=seed, rank=rank, world_size=world_size,
                         batch_size=batch_size)
        self.draws_per_epoch = int(num_samples or n)


class SizeAwareSampler(Sampler):
    """Bin-packed batches that never exceed ``max_atoms``, ``max_edges``, ``max_nnz`` or
    ``max_batch_size`` (a guarantee), in a shuffled order per epoch.

    Two forms:

    - nvalchemi's: ``SizeAwareSampler(dataset, max_atoms, max_edges, max_batch_size=None)``
      with the dataset first (a :class:`zbatch.Dataset`, a :class:`zbatch.AtomicReader`, or
      any object with ``len`` and ``get_metadata(i) -> (num_atoms, num_edges)``); sizes come
      from its pointer arrays. ``max_batch_size=None`` leaves the number of systems free.
      ``max_atoms=None``: no atom limit when ``max_batch_size`` is given; with
      ``device="cuda..."`` a limit estimated from that GPU's free memory
      (:func:`zbatch.estimate_max_atoms`, ``max_gpu_memory_fraction`` of it); with neither,
      a ValueError.
    - the keyword form: ``SizeAwareSampler(batch_size, num_atoms=..., num_edges=..., nnz=...,
      max_atoms=..., ...)`` with per-sample sizes given (e.g. ``np.diff(atoms_ptr)``).

    A limit left ``None`` is not enforced. A sample that alone exceeds a limit raises
    :class:`zbatch.ZbatchError` naming its id. Each window of ``window_size`` samples of the
    permuted order is packed on its own (first fit, or first-fit decreasing when that needs
    fewer batches). Every sample appears in exactly one batch per epoch. ``drop_last`` is
    accepted and ignored (batch sizes vary by design).

    Dynamics (inflight batching, nvalchemi's ``SizeAwareSampler`` semantics, dataset form
    only): :meth:`build_initial_batch` and :meth:`request_replacement` draw from a pool of
    unconsumed samples binned by atom count (``bin_width``), independent of the epoch order.
    In the keyword form :meth:`request_replacement` returns an unused id of this rank's epoch.

    Chunk-aware (``block_size=K``, opt-in): the epoch permutes blocks of ``K`` consecutive
    samples instead of single samples (a short last block stays last), each window holds whole
    blocks (``window_size`` rounded up to a multiple of ``K``) and is shuffled inside before
    packing; ``block_size="chunks"`` takes ``K`` from the store (:func:`chunk_block_size`).
    With ``K`` about the samples per stored chunk and a DataLoader whose
    ``prefetch_factor`` holds a window's batches, each chunk is decoded about once per window
    instead of once per batch that touches it (stores whose chunks hold many samples, such as
    nvalchemi's default layout); batches then mix ``window_size / K`` blocks instead of the
    whole dataset (docs/SAMPLERS.md).
    """

    kind = "size_aware"

    def __init__(self, dataset: Any = None, max_atoms: Optional[int] = None,
                 max_edges: Optional[int] = None, max_batch_size: Optional[int] = None, *,
                 batch_size: Optional[int] = None, num_atoms=None, num_edges=None,
                 nnz=None, max_nnz: Optional[int] = None, window_size: int = 8192,
                 shuffle: bool = True, drop_last: bool = False, seed: int = 0,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 pad_or_drop: str = "pad", device: Any = None, bin_width: int = 1,
                 max_gpu_memory_fraction: float = 0.8,
                 block_size: Union[int, str, None] = None):
        del drop_last   # accepted for a uniform signature; packed batches have no short tail
        if isinstance(dataset, (int, _np.integer)) and not isinstance(dataset, bool):
            if batch_size is not None:   # the keyword form's positional batch_size
                raise ValueError("batch_size given twice")
            dataset, batch_size = None, int(dataset)
        self.dataset = dataset
        if dataset is not None:
            if num_atoms is not None or num_edges is not None:
                raise ValueError("give a dataset or num_atoms / num_edges, not both")
            num_atoms, num_edges = _dataset_sizes(dataset)
            if max_atoms is None:
                max_atoms = _default_max_atoms(device, max_batch_size, max_gpu_memory_fraction)
            if max_batch_size is None and batch_size is None:
                batch_size = max(len(num_atoms), 1)   # no limit on the number of systems
        if batch_size is None:
            batch_size = max_batch_size
        elif max_batch_size is not None and int(max_batch_size) != int(batch_size):
            raise ValueError("batch_size and max_batch_size disagree")
        if batch_size is None:
            raise ValueError("SizeAwareSampler needs max_batch_size (or batch_size)")
        if int(bin_width) < 1:
            raise ValueError(f"bin_width must be >= 1, got {bin_width}")
        if isinstance(block_size, str):
            if block_size != "chunks" or dataset is None:
                raise ValueError(f"block_size: 'chunks' (with a dataset), an int or None, got "
                                 f"{block_size!r}")
            block_size = chunk_block_size(dataset)
        if block_size is not None and int(block_size) < 1:
            raise ValueError(f"block_size must be >= 1 (or None), got {block_size}")
        arrays = {"num_atoms": _u64(num_atoms, "num_atoms"),
                  "num_edges": _u64(num_edges, "num_edges"), "nnz": _u64(nnz, "nnz")}
        limits = {"num_atoms": max_atoms, "num_edges": max_edges, "nnz": max_nnz}
        lens = {len(a) for a in arrays.values() if a is not None}
        if not lens:
            raise ValueError("give at least one of num_atoms, num_edges, nnz")
        if len(lens) > 1:
            raise ValueError(f"size arrays differ in length: {sorted(lens)}")
        n = lens.pop()
        for name, lim in limits.items():
            if lim is not None and int(lim) < 1:
                raise ValueError(f"the limit for {name} must be >= 1, got {lim}")
            if lim is not None and arrays[name] is None:
                raise ValueError(f"a limit for {name} needs the {name} array")
        kw, rank, world_size = _base(n, batch_size, False, seed, rank, world_size, pad_or_drop)
        self._arrays = arrays
        c = _zbatch.sampler_size_aware(
            num_atoms=arrays["num_atoms"], max_atoms=int(max_atoms or 0),
            num_edges=arrays["num_edges"], max_edges=int(max_edges or 0),
            nnz=arrays["nnz"], max_nnz=int(max_nnz or 0), window_size=int(window_size),
            shuffle=bool(shuffle), block_size=int(block_size or 0), **kw)
        super().__init__(c, seed=seed, rank=rank, world_size=world_size,
                         batch_size=batch_size)
        self.max_atoms, self.max_edges, self.max_nnz = max_atoms, max_edges, max_nnz
        self._limit_batch = max_batch_size if dataset is not None else batch_size
        self.bin_width = int(bin_width)
        self.block_size = None if block_size is None else int(block_size)
        self.window_size = int(window_size)
        self._n = n
        self._pool = None   # the dynamics pool, made on first use

    @property
    def max_batch_size(self) -> int:
        return self._batch_size

    def request_replacement(self, num_atoms: Optional[int] = None,
                            num_edges: Optional[int] = None) -> Any:
        """A sample that fits the room ``num_atoms`` / ``num_edges`` (``None``: unchecked).

        Dataset form (nvalchemi's semantics): the unconsumed sample of the largest atom bin
        at most ``num_atoms // bin_width`` that fits, first in dataset order within its bin,
        returned as nvalchemi's ``AtomicData`` (a dict of tensors without nvalchemi) with a
        ``system_id`` stamped on it; ``None`` when nothing fits. It is then consumed.

        Keyword form: an id of this epoch that this rank has not used yet and that fits,
        preferring the largest; ``None`` when nothing fits. The id is then left out of the
        later batch it belonged to. Replacements are not part of :meth:`state_dict`."""
        if self.dataset is not None:
            return self._dynamics().request_replacement(num_atoms, num_edges)
        ra = _U64_MAX if num_atoms is None else int(num_atoms)
        re = _U64_MAX if num_edges is None else int(num_edges)
        if ra < 0 or re < 0:
            raise ValueError("room must be >= 0")
        return self._c.request_replacement(ra, re)

    def build_initial_batch(self):
        """Dataset form: a first batch for a dynamics loop (nvalchemi's semantics): one
        sample per atom bin in turn (smallest bin first, dataset order within a bin) while
        the limits allow, as an ``nvalchemi.data.Batch`` (``zbatch.AtomicBatch`` without
        nvalchemi) with ``system_id`` and a zero ``status`` per system. The samples are
        consumed. RuntimeError when nothing fits."""
        return self._dynamics().build_initial_batch()

    @property
    def exhausted(self) -> bool:
        """Dataset form: whether every sample of the dynamics pool has been consumed."""
        return self._dynamics().exhausted

    def _dynamics(self):
        if self.dataset is None:
            raise TypeError("build_initial_batch needs the dataset form: "
                            "SizeAwareSampler(dataset, max_atoms, max_edges, max_batch_size)")
        if self._pool is None:
            from ._nvbatch import DynamicsPool
            self._pool = DynamicsPool(self.dataset, self._arrays["num_atoms"],
                                      self._arrays["num_edges"], self.max_atoms,
                                      self.max_edges, self._limit_batch, self.bin_width)
        return self._pool


def _dataset_sizes(dataset: Any) -> tuple[_np.ndarray, _np.ndarray]:
    """Per-sample atom and edge counts of a dataset: from a zbatch dataset's pointer arrays,
    else through ``get_metadata(i)`` (nvalchemi's protocol)."""
    zb = getattr(dataset, "dataset", dataset)   # an AtomicReader's zbatch dataset
    if hasattr(zb, "segment_lengths") and getattr(zb, "layout", None) == "atomic":
        segments = {info.get("segment") for info in zb.fields.values()}
        atoms = zb.segment_lengths("atoms")
        edges = zb.segment_lengths("edges") if "edges" in segments else \
            _np.zeros(len(atoms), dtype=_np.uint64)
        return atoms, edges
    if not hasattr(dataset, "get_metadata") or not hasattr(dataset, "__len__"):
        raise TypeError(f"SizeAwareSampler: {type(dataset).__name__} is not a dataset: it "
                        "needs __len__ and get_metadata(i) -> (num_atoms, num_edges) (or is "
                        "a zbatch atomic dataset)")
    meta = _np.array([dataset.get_metadata(i) for i in range(len(dataset))],
                     dtype=_np.int64).reshape(-1, 2)
    return meta[:, 0], meta[:, 1]


def chunk_block_size(dataset: Any) -> int:
    """The samples per stored chunk of a zbatch dataset's heaviest field (the one with the most
    decoded bytes): the ``block_size`` that aligns chunk-aware packing to the store's chunks.
    A ragged field of ``chunk_rows`` rows per chunk over a segment of ``total`` rows holds about
    ``chunk_rows * n / total`` samples per chunk; a per-sample field ``chunk_rows``. At least 1.

    Example (nvalchemi's default layout, 313,896-row ``neighbor_list`` chunks over 80.4 M edges
    of 20,000 structures)::

        >>> zbatch.samplers.chunk_block_size(ds)
        78
    """
    zb = getattr(dataset, "dataset", dataset)   # an AtomicReader's zbatch dataset
    if not hasattr(zb, "segment_lengths") or not hasattr(zb, "fields"):
        raise TypeError(f"block_size='chunks' needs a zbatch dataset, not "
                        f"{type(dataset).__name__}")
    return max(1, int(round(samples_per_chunk(zb))))


def samples_per_chunk(zb: Any) -> float:
    """The samples per stored chunk of the heaviest field of a zbatch dataset, unrounded (1.0
    when no field has chunks): :func:`chunk_block_size` before rounding, and the test of
    ``zbatch.open(cache_bytes="auto")``."""
    n = len(zb)
    totals: dict[str, int] = {}
    best_bytes, best = -1, 1.0
    for info in zb.fields.values():
        rows = int(info.get("chunk_rows") or 0)
        if rows == 0 or n == 0:
            continue
        width = _np.dtype(info["dtype"]).itemsize * int(_np.prod(info["row_shape"], dtype=_np.int64))
        seg = info.get("segment")
        if seg:
            if seg not in totals:
                totals[seg] = int(zb.segment_lengths(seg).sum())
            total = totals[seg]
            per_chunk = rows * n / total if total else float(n)
        else:
            total, per_chunk = n, float(rows)
        if total * width > best_bytes:
            best_bytes, best = total * width, per_chunk
    return best


def _default_max_atoms(device: Any, max_batch_size: Optional[int],
                       fraction: float) -> Optional[int]:
    """max_atoms=None: a limit from the free memory of a CUDA ``device``; no limit when
    max_batch_size bounds the batches; else the error of estimate_max_atoms."""
    from ._nvbatch import estimate_max_atoms
    if device is None and max_batch_size is not None:
        return None
    if device is None:
        raise ValueError("SizeAwareSampler(max_atoms=None) estimates a limit from free GPU "
                         "memory when batches go to a GPU: give device='cuda' (or "
                         "max_atoms, or max_batch_size)")
    return estimate_max_atoms(device, fraction=fraction)


class _InvalidOptions(_zbatch.ZbatchError, ValueError):
    """A ZB_E_INVALID from a sampler constructor: a ``ValueError`` (as nvalchemi raises) that is
    still a :class:`zbatch.ZbatchError`."""


def _sampler_multi(**kw) -> Any:
    try:
        return _zbatch.sampler_multi(**kw)
    except _zbatch.ZbatchError as e:
        if getattr(e, "status", None) != "ZB_E_INVALID":
            raise
        err = _InvalidOptions(str(e))
        err.status, err.code = e.status, getattr(e, "code", None)
        raise err from None


def _child_lengths(dataset: Any) -> list[int]:
    """The children's lengths: a zbatch ``MultiDataset`` (``.sizes``), an nvalchemi one
    (``.datasets``), or a sequence of lengths or of children (``len()`` of each)."""
    if hasattr(dataset, "sizes") and not isinstance(dataset, (list, tuple)):
        lengths = [int(v) for v in dataset.sizes]
    elif hasattr(dataset, "datasets"):
        lengths = [len(c) for c in dataset.datasets]
    else:
        lengths = [int(v) if isinstance(v, (int, _np.integer)) else len(v) for v in dataset]
    if not lengths:
        raise ValueError("a multi-dataset sampler needs at least one child")
    return lengths


def _multi_rank_world(rank, world_size, num_replicas, distributed_manager):
    """nvalchemi's ``num_replicas`` / ``distributed_manager`` next to zbatch's ``world_size``."""
    if distributed_manager is not None and distributed_manager.is_initialized():
        num_replicas, rank = distributed_manager.world_size, distributed_manager.rank
    if num_replicas is not None:
        if int(num_replicas) < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if world_size is not None and int(world_size) != int(num_replicas):
            raise ValueError(f"num_replicas={num_replicas} and world_size={world_size} disagree")
        world_size = num_replicas
    return rank, world_size


def _seed_of(seed: int, generator: Any) -> int:
    # a torch.Generator stands for its seed: zbatch's orders are keyed hashes, not its stream
    return int(generator.initial_seed()) if generator is not None else int(seed)


def _is_rate(v: Any) -> bool:
    return isinstance(v, _numbers.Real) and not isinstance(v, _numbers.Integral)


def _multi_offsets(lengths: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(x) for x in _np.concatenate([[0], _np.cumsum(lengths)]))


class _MultiBase(Sampler):
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]

    @property
    def lengths(self) -> list[int]:
        """The children's lengths (nvalchemi's name)."""
        return list(self.sizes)

    def to_local(self, ids) -> tuple[_np.ndarray, _np.ndarray]:
        """``(child index, local id)`` of global ids."""
        ids = _np.asarray(ids, dtype=_np.int64)
        child = _np.searchsorted(_np.asarray(self.offsets[1:]), ids, side="right")
        return child, ids - _np.asarray(self.offsets)[child]

    def to_global_index(self, dataset_index: int, local_index: int) -> int:
        """The global id of ``local_index`` in child ``dataset_index``."""
        if not 0 <= local_index < self.sizes[dataset_index]:
            raise IndexError(f"local index {local_index} is outside child {dataset_index} "
                             f"of {self.sizes[dataset_index]} samples")
        return self.offsets[dataset_index] + int(local_index)


class MultiDatasetBatchSampler(_MultiBase):
    """Batches with a fixed composition from several datasets ("children"): nvalchemi's
    ``MultiDatasetBatchSampler``, with the same batch counts, compositions and errors.

    ``dataset`` is a :class:`zbatch.MultiDataset`, an nvalchemi ``MultiDataset``, or a
    sequence of child lengths (or of children: ``len()`` is taken); ids are global,
    ``offsets[i] + local id``. Every batch holds ``samples_per_dataset[i]`` samples of child
    ``i``: integers are exact counts (summing to ``batch_size``); floats, or ``weights``, are
    relative rates turned into counts by largest remainder; the default rates are the child
    lengths; :meth:`balanced` (or ``balanced=True``) gives every child the same rate.

    The epoch has ``num_batches`` batches, or as ``epoch_policy`` says, with
    ``m_i = ceil(len_i / count_i)`` with replacement and ``floor`` without:
    ``"dataset_size"`` is ``ceil(sum(len) / batch_size)`` with replacement and ``min(m_i)``
    without; ``"min_size"`` ``min(m_i)``; ``"max_size"`` ``max(m_i)`` (a ``ValueError``
    without replacement unless all ``m_i`` are equal). Without replacement no child sample
    repeats within an epoch, and more than ``min(m_i)`` batches is a ``ValueError``. Every
    batch is full. ``replacement`` defaults to ``True``, as in nvalchemi.

    ``drop_last`` is nvalchemi's: drop the tail batches so that all ranks get the same number
    (``pad_or_drop="drop"``); otherwise the last ranks repeat batches from the epoch's start.
    ``generator`` stands for its ``initial_seed()``; ids differ from nvalchemi's (another
    random stream), batch counts and compositions do not.

    Example::

        >>> s = MultiDatasetBatchSampler([100, 300], batch_size=8, samples_per_dataset=[2, 6])
        >>> len(s), s.samples_per_dataset
        (50, (2, 6))
    """

    kind = "multi"

    def __init__(self, dataset: Any, batch_size: int, *,
                 weights: Optional[Sequence[float]] = None,
                 samples_per_dataset: Optional[Sequence[Union[int, float]]] = None,
                 num_batches: Optional[int] = None, epoch_policy: str = "dataset_size",
                 replacement: bool = True, shuffle: bool = True, generator: Any = None,
                 num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 distributed_manager: Any = None, seed: int = 0, drop_last: bool = False,
                 balanced: bool = False, world_size: Optional[int] = None,
                 pad_or_drop: Optional[str] = None):
        lengths = _child_lengths(dataset)
        if (weights is not None) + (samples_per_dataset is not None) + bool(balanced) > 1:
            raise ValueError("weights, samples_per_dataset and balanced are mutually exclusive")
        if balanced:
            weights = [1.0] * len(lengths)
        counts = ratios = None
        if samples_per_dataset is not None:
            vals = list(samples_per_dataset)
            if len(vals) != len(lengths):
                raise ValueError(f"Expected {len(lengths)} per-dataset counts, got {len(vals)}")
            if any(_is_rate(v) for v in vals):
                ratios = vals
            else:
                for v in vals:
                    if isinstance(v, (bool, _np.bool_)) or not isinstance(v, _numbers.Integral):
                        raise TypeError("Integer samples_per_dataset entries must be integral "
                                        f"counts, got {v!r}")
                counts = [int(v) for v in vals]
                if any(v < 0 for v in counts):
                    raise ValueError("samples_per_dataset counts must be non-negative")
        elif weights is not None:
            ratios = list(weights)
            if len(ratios) != len(lengths):
                raise ValueError(f"Expected {len(lengths)} dataset weights, got {len(ratios)}")
        if num_batches is not None and int(num_batches) < 1:
            raise ValueError(f"num_batches must be >= 1, got {num_batches}")
        if num_batches is None and epoch_policy not in _POLICIES:
            raise ValueError("epoch_policy must be one of 'dataset_size', 'min_size', or "
                             f"'max_size', got {epoch_policy!r}")
        rank, world_size = _multi_rank_world(rank, world_size, num_replicas,
                                             distributed_manager)
        seed = _seed_of(seed, generator)
        kw, rank, world_size = _base(sum(lengths), batch_size, False, seed, rank, world_size,
                                     pad_or_drop or ("drop" if drop_last else "pad"))
        c = _sampler_multi(child_sizes=_u64(lengths, "sizes"), per_sample=False,
                           counts=_u64(counts, "samples_per_dataset"),
                           ratios=_f64(ratios, "weights"), balanced=False,
                           epoch_policy=_POLICIES.get(epoch_policy, 0),
                           num_batches=int(num_batches or 0), num_samples=0,
                           replacement=bool(replacement), shuffle=bool(shuffle), **kw)
        super().__init__(c, seed=seed, rank=rank, world_size=world_size,
                         batch_size=batch_size)
        self.sizes = tuple(lengths)
        self.offsets = _multi_offsets(lengths)
        self.epoch_policy = epoch_policy
        self.replacement = bool(replacement)
        self.shuffle = bool(shuffle)

    @classmethod
    def balanced(cls, dataset: Any, *, batch_size: int, **kwargs) -> "MultiDatasetBatchSampler":
        """Equal rates for every child (nvalchemi's ``MultiDatasetBatchSampler.balanced``);
        the other keyword arguments as for the constructor."""
        return cls(dataset, batch_size, weights=[1.0] * len(_child_lengths(dataset)), **kwargs)

    @property
    def samples_per_dataset(self) -> tuple[int, ...]:
        """Samples of each child in every batch."""
        return tuple(int(v) for v in self._c.child_counts())

    @property
    def num_batches(self) -> int:
        """Global batches per epoch (all ranks, before padding or dropping)."""
        return self.epoch_batches


_BATCH_ONLY = ("samples_per_dataset", "num_batches", "epoch_policy", "balanced")


class MultiDatasetSampler(_MultiBase):
    """Ids from several datasets ("children") at per-sample rates: nvalchemi's
    ``MultiDatasetSampler``, cut into batches of ``batch_size``.

    ``dataset`` as for :class:`MultiDatasetBatchSampler`. An epoch holds ``num_samples`` ids
    (default: all children's lengths together), the last batch short when ``batch_size`` does
    not divide it. The child of each id follows ``weights`` (default: the child lengths, i.e.
    uniform over the concatenation), so a batch's composition varies (use
    :class:`MultiDatasetBatchSampler` for a fixed one). With ``replacement`` (the default,
    as in nvalchemi) and ``shuffle`` every id draws its child and local id independently;
    otherwise the epoch holds exactly ``round(weight_i * num_samples)`` ids of child ``i``
    (largest remainder), distinct without replacement (a ``ValueError`` when a child is too
    small), in random order with ``shuffle`` and in nvalchemi's order without (all of child
    0's share, then child 1's, ...; local ids 0, 1, ... cycled). ``drop_last`` drops the
    short last batch (as a torch ``DataLoader(drop_last=True)`` over nvalchemi's sampler
    would) and gives all ranks the same number of batches (``pad_or_drop="drop"``, nvalchemi's
    meaning); ``generator`` stands for its ``initial_seed()``.

    Example::

        >>> s = MultiDatasetSampler([10, 30], batch_size=8, weights=[1.0, 1.0],
        ...                         num_samples=20, replacement=False)
        >>> [len(b) for b in s], s.samples_per_child
        ([8, 8, 4], (10, 10))
    """

    kind = "multi_sample"

    def __init__(self, dataset: Any, batch_size: int = 1, *,
                 weights: Optional[Sequence[float]] = None, num_samples: Optional[int] = None,
                 replacement: bool = True, shuffle: bool = True, generator: Any = None,
                 num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 distributed_manager: Any = None, seed: int = 0, drop_last: bool = False,
                 world_size: Optional[int] = None, pad_or_drop: Optional[str] = None,
                 **batch_options: Any):
        if batch_options:
            wrong = sorted(batch_options)
            hint = ("; those set a fixed composition per batch: use MultiDatasetBatchSampler"
                    if all(k in _BATCH_ONLY for k in wrong) else "")
            raise TypeError(f"MultiDatasetSampler got unexpected keyword arguments {wrong}{hint}")
        lengths = _child_lengths(dataset)
        if weights is not None and len(weights) != len(lengths):
            raise ValueError(f"Expected {len(lengths)} dataset weights, got {len(weights)}")
        if num_samples is not None and int(num_samples) < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        rank, world_size = _multi_rank_world(rank, world_size, num_replicas,
                                             distributed_manager)
        seed = _seed_of(seed, generator)
        # drop_last: nvalchemi's (the same number of batches on every rank) and, since this
        # sampler also cuts the batches, torch DataLoader's (no short last batch)
        kw, rank, world_size = _base(sum(lengths), batch_size, drop_last, seed, rank,
                                     world_size, pad_or_drop or ("drop" if drop_last else "pad"))
        c = _sampler_multi(child_sizes=_u64(lengths, "sizes"), per_sample=True, counts=None,
                           ratios=_f64(weights, "weights"), balanced=False, epoch_policy=0,
                           num_batches=0, num_samples=int(num_samples or 0),
                           replacement=bool(replacement), shuffle=bool(shuffle), **kw)
        super().__init__(c, seed=seed, rank=rank, world_size=world_size,
                         batch_size=batch_size)
        self.sizes = tuple(lengths)
        self.offsets = _multi_offsets(lengths)
        self.num_samples_per_epoch = int(num_samples or sum(lengths))
        self.replacement = bool(replacement)
        self.shuffle = bool(shuffle)

    @property
    def samples_per_child(self) -> tuple[int, ...]:
        """Ids of each child per epoch (exact, except with replacement and shuffle, where it
        is the expected number rounded)."""
        return tuple(int(v) for v in self._c.child_counts())


_NAMES = {"sequential": SequentialSampler, "random": RandomSampler, "block": BlockSampler,
          "weighted": WeightedSampler, "size_aware": SizeAwareSampler,
          "multi": MultiDatasetBatchSampler, "multi_sample": MultiDatasetSampler}
_ALIASES = {"size-aware": "size_aware", "sizeaware": "size_aware", "multi_dataset": "multi",
            "multidataset": "multi", "multi_dataset_batch": "multi", "shuffle": "random"}


def make_sampler(name: str, n: Optional[int], batch_size: int, **kwargs) -> Sampler:
    """A sampler by name: ``"sequential"``, ``"random"``, ``"block"``, ``"weighted"``,
    ``"size_aware"``, ``"multi"`` (:class:`MultiDatasetBatchSampler`) or ``"multi_sample"``
    (:class:`MultiDatasetSampler`), over ``n`` samples, with the class's keyword arguments.

    ``"weighted"`` without ``weights`` / ``class_codes`` draws uniformly with replacement;
    ``"size_aware"`` takes ``batch_size`` as ``max_batch_size``; ``"multi"`` and
    ``"multi_sample"`` need ``sizes`` (whose sum must be ``n`` when ``n`` is given).

    Example::

        >>> make_sampler("block", 10_000, 256, block_size=64, seed=3)   # doctest: +SKIP
    """
    key = _ALIASES.get(str(name).lower(), str(name).lower())
    if key not in _NAMES:
        raise ValueError(f"unknown sampler {name!r}; expected one of {sorted(_NAMES)}")
    if key in ("sequential", "random", "block"):
        if n is None:
            raise ValueError(f"make_sampler({key!r}) needs n")
        return _NAMES[key](n, batch_size, **kwargs)
    if key == "weighted":
        if kwargs.get("weights") is None and kwargs.get("class_codes") is None:
            if n is None:
                raise ValueError("make_sampler('weighted') needs n or weights")
            kwargs["weights"] = _np.ones(int(n))
        s = WeightedSampler(batch_size=batch_size, **kwargs)
    elif key == "size_aware":
        s = SizeAwareSampler(batch_size=batch_size, **kwargs)
    else:
        if "sizes" not in kwargs:
            raise ValueError(f"make_sampler({key!r}) needs sizes=[len of each child]")
        s = _NAMES[key](kwargs.pop("sizes"), batch_size, **kwargs)
    if n is not None and s.num_samples != int(n):
        raise ValueError(f"make_sampler({key!r}): the sampler covers {s.num_samples} samples, "
                         f"not n={n}")
    return s
