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

import collections
import itertools
import os
import sys
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np

from . import _zbatch
from .dataset import Batch, Dataset
from .transforms import Compose, check_sequence

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

    Parameters follow PyTorch's DataLoader where they overlap (see docs/PYTORCH.md):
        batch_size (default 4096), shuffle, drop_last, seed;
        sampler: a name ("sequential", "random", "block", "weighted", "size_aware", "multi",
            "multi_sample") or
            a sampler object from :mod:`zbatch.samplers` (the C pipeline, exact resume); extra
            keyword arguments go to a named sampler (e.g. ``block_size=64,
            blocks_per_window=16`` for "block"). Any other sampler (a
            ``torch.utils.data.Sampler`` or an iterable of sample ids) is batched by
            ``batch_size`` / ``drop_last`` and its batches are read ahead on threads;
        batch_sampler: a ``torch.utils.data.BatchSampler`` or any iterable of lists of ids
            (exclusive with batch_size, shuffle, sampler and drop_last, as in PyTorch);
        prefetch_factor: batches per window (one coalesced read; default 4, and for the block
            sampler at least enough batches to hold its window of ``block_size *
            blocks_per_window`` rows, so its chunks are decoded once; for a chunk-aware
            size-aware sampler (``block_size``) the batches of two of its windows); depth:
            windows read ahead;
        num_threads: decode threads of the dataset (None keeps the dataset's; >= 1);
        num_workers: PyTorch's knob: zbatch's workers are threads, so ``num_workers=N``
            (N > 0) means N decode threads unless num_threads is given;
        output: "numpy", "scipy", "torch" or, for atomic stores, "nvalchemi" (an
            ``nvalchemi.data.Batch`` per batch, or a :class:`zbatch.AtomicBatch` without
            nvalchemi); device / pin_memory: where torch / nvalchemi batches go
            (docs/GPU.md): device="cuda" copies each batch to the GPU on the loader's own
            CUDA streams (``num_streams``, default 2) from page-locked window memory, and
            the batch's tensors are on the device, the current stream ordered after the
            copy; pin_memory=True reads windows into page-locked memory (no extra copy);
        densify: None, "host" (the C "densify" transform: X_dense on the worker) or
            "device" (X scattered into a dense float32 X_dense on the GPU, with
            device="cuda");
        rank / world_size: None resolves them from torch.distributed, then RANK/WORLD_SIZE;
        transforms: C transforms by name, run on the loader's worker thread: "log1p",
            ("normalize_total", target_sum), ("densify", columns_or_None), ("cast", field, dtype);
        batch_transforms: Python callables ``fn(batch) -> batch`` run in the consumer thread,
            composed with nvalchemi's rules (:mod:`zbatch.transforms`: left to right, each
            must return the batch, a Batch or a dict; an exception comes out as a
            RuntimeError naming the transform's position);
        collate_fn: a callable applied last to every batch; its result is what iteration
            yields.

    Iteration: every ``iter(loader)`` is an independent pass. Without :meth:`set_epoch` each
    pass uses the next epoch (a fresh order, as torch's ``shuffle=True``); once set_epoch has
    been called, the epoch set decides. A second iterator started while another is live runs
    its own pipeline over the same epoch from its start and is not part of
    :meth:`state_dict` (which follows the first one).
    """

    def __init__(self, dataset: Dataset, batch_size: Optional[int] = None, shuffle: bool = False,
                 sampler: Union[str, Any, None] = None, seed: int = 0,
                 prefetch_factor: Optional[int] = None,
                 num_threads: Optional[int] = None, drop_last: bool = False,
                 output: str = "numpy", device: Any = "cpu", pin_memory: bool = False,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 transforms: Optional[Sequence] = None,
                 batch_transforms: Optional[Sequence[Callable]] = None, depth: int = 2, *,
                 batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Optional[Callable] = None, densify: Optional[str] = None,
                 num_streams: int = 2, **sampler_kwargs):
        from . import samplers as _samplers
        from .dataset import _check_output
        _check_output(output, dataset.layout)
        if (prefetch_factor is not None and prefetch_factor < 1) or depth < 1:
            raise ValueError("prefetch_factor and depth must be >= 1")
        if int(num_workers) < 0:
            raise ValueError("num_workers option should be non-negative; "
                             "use num_workers=0 to disable multiprocessing.")
        if num_threads is not None and int(num_threads) < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable, got {type(collate_fn).__name__}")
        check_sequence(batch_transforms, "batch_transforms")
        self._batch_compose = Compose(batch_transforms or ())
        if self._batch_compose.kind == "sample":
            raise TypeError("batch_transforms are per-batch (fn(batch) -> batch); a sample "
                            "transform goes in zbatch.Dataset(reader, transforms=[...])")
        self._batch_compose.is_batch = True   # unannotated callables get the batch
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None and (batch_size not in (None, 1) or shuffle or
                                          sampler is not None or drop_last):
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
        device, pin_memory = _check_device(device, bool(pin_memory), output)
        if densify not in (None, "host", "device"):
            raise ValueError(f"densify must be None, 'host' or 'device', got {densify!r}")
        if densify == "device" and (output != "torch" or not device.startswith("cuda")):
            raise ValueError("densify='device' scatters X on the GPU: it needs output='torch' "
                             f"and device='cuda', got output={output!r}, device={device!r}")
        if int(num_streams) < 1:
            raise ValueError(f"num_streams must be >= 1, got {num_streams}")
        self.densify = densify
        self.num_streams = int(num_streams)
        if batch_size is None:
            batch_size = 4096
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.prefetch_factor = int(prefetch_factor or 4)   # settled once the sampler is known
        self.depth = int(depth)
        self.output = output
        self.device = device
        self.pin_memory = pin_memory
        self.num_workers = int(num_workers)
        self.collate_fn = collate_fn
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self._transforms = _transform_specs(transforms)
        reader_pipeline = getattr(dataset, "_python_pipeline", None)
        if reader_pipeline is False:   # a zbatch dataset with its C transforms: C pipeline
            self._transforms = list(dataset._c_transforms) + self._transforms
        if densify == "host":
            self._transforms.append(("densify",))
        # where the C loader puts batches (zbatch_cuda.h); a fallback is warned about once
        cuda = device.startswith("cuda")
        self._placement = "device" if cuda and output == "torch" else \
            "pinned" if pin_memory or cuda else "host"
        self._placed = None   # (placement, reason) of the last C loader opened
        self._stream_of = None   # torch's current stream, for pinned batches' releases
        self.batch_transforms = list(batch_transforms or ())
        if num_threads is None and self.num_workers > 0:
            num_threads = self.num_workers
        if num_threads is not None:
            dataset.set_num_threads(int(num_threads))
        self.batch_sampler = None
        self._py: Optional[_PySampler] = None
        if isinstance(batch_sampler, _samplers.Sampler):
            sampler, batch_sampler = batch_sampler, None   # zbatch samplers yield batches
            self.batch_size = sampler.batch_size
        if batch_sampler is not None:
            if sampler_kwargs:
                raise TypeError(f"sampler options {sorted(sampler_kwargs)} need a sampler name")
            self._py = _PySampler(batch_sampler, None, False)
            self.batch_sampler = batch_sampler
            sampler = getattr(batch_sampler, "sampler", None)
        else:
            if sampler is None:
                sampler = "random" if shuffle else "sequential"
            if isinstance(sampler, str):
                sampler_kwargs = _dataset_sampler_args(dataset, sampler, sampler_kwargs)
                sampler = _samplers.make_sampler(sampler, n=len(dataset),
                                                 batch_size=self.batch_size,
                                                 drop_last=drop_last, seed=seed,
                                                 rank=self.rank, world_size=self.world_size,
                                                 **sampler_kwargs)
            elif sampler_kwargs:
                raise TypeError(f"sampler options {sorted(sampler_kwargs)} need a sampler name")
            elif not isinstance(sampler, _samplers.Sampler):
                self._py = _PySampler(sampler, self.batch_size, self.drop_last)
            if reader_pipeline and self._py is None:
                # a reader dataset: the zbatch sampler is driven from Python, batches are
                # read on prefetch threads (_py_pass)
                self._py = _SamplerDriver(sampler)
                sampler._owner = weakref.ref(self)   # its set_epoch / state go through here
        self.sampler = sampler
        if prefetch_factor is None and isinstance(sampler, _samplers.BlockSampler):
            # a window (one coalesced read) holding the block sampler's whole window: a shorter
            # one decodes the window's chunks once per read that touches them (SAMPLERS.md)
            rows = sampler.block_size * sampler.blocks_per_window
            self.prefetch_factor = max(4, -(-rows // self.batch_size))
        elif (prefetch_factor is None and isinstance(sampler, _samplers.SizeAwareSampler)
              and sampler.block_size and len(sampler)):
            # chunk-aware packing: a window holding two of the sampler's windows (their batch
            # counts vary), so each read decodes the chunks of at most three sampler windows
            per_batch = sampler._n / (len(sampler) * sampler._world_size)
            self.prefetch_factor = max(4, -(-2 * sampler.window_size // max(int(per_batch), 1)))
        # the main iterator (a weak reference to the _Pass that state_dict follows)
        self._main: Optional[weakref.ref] = None
        self._live: Optional[Any] = None
        self._parked: Optional[int] = None
        self._epoch_set = False
        self._resume = False  # a loaded state: the next iteration continues from it
        if self._py is not None:
            self._epoch = 0
            self._py_pos = 0           # batches the main pass handed out
            self._py_gen_state = None  # the generator's state when the main pass began
            self._py_skip = 0
            return
        self._epoch = int(sampler._state_dict().get("epoch", 0))
        # the next pass runs self._epoch (set at start, by set_epoch and load_state_dict);
        # otherwise a pass follows one: the next epoch, or the same one once set_epoch is used
        self._fresh = True
        # the sampler's set_epoch / state_dict / load_state_dict are this loader's from now on
        # (its C state belongs to the worker threads while a C loader is alive)
        sampler._owner = weakref.ref(self)
        # After a pass that ran to its end the C loader stays alive and reads on into the
        # epoch the next pass will most likely ask for (``_parked``): epoch + 1 (the next
        # pass of a loader without set_epoch, the next set_epoch of one with). A pass over
        # another epoch, a rewind or a loaded state closes it and starts afresh, so the guess
        # only decides how fast the next pass starts, never what it yields. Reading on is
        # bounded like any pass: at most `depth` windows, whose memory the dataset's batch
        # pool would keep anyway. Only a live C loader is parked (close() and
        # load_state_dict() clear _parked).

    def __len__(self) -> int:
        if self._py is not None:
            return self._py.num_batches()
        return len(self.sampler)

    # -- epochs and state ------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` (also rewinds a partly consumed epoch); from now on the
        epoch set decides every pass (passes no longer advance it). ``loader.sampler.
        set_epoch(epoch)`` does the same."""
        epoch = int(epoch)
        if epoch < 0:  # (checked before anything changes; the sampler checks it again)
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._epoch_set = True
        if isinstance(self._py, _SamplerDriver):
            self._epoch = epoch
            self._py.set_epoch(epoch)
            return
        if self._py is not None:
            self._epoch = epoch
            if hasattr(self.sampler, "set_epoch") and self.sampler is not None:
                self.sampler.set_epoch(epoch)
            return
        self._fresh = True
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
        """The exact position of the main iterator: restoring it continues after the last
        batch it handed out. ``{"kind", "seed", "epoch", "position", "num_samples"}`` for
        zbatch samplers (without set_epoch, ``epoch`` counts the passes); for other samplers
        ``{"kind": "python", "position", "num_samples", "generator_state"}`` (see
        docs/PYTORCH.md)."""
        n = len(self.dataset)
        if isinstance(self._py, _SamplerDriver):
            return {**self._py.state_dict(), "num_samples": n}
        if self._py is not None:
            gen = self._py.generator()
            gstate = self._py_gen_state
            if gstate is None and gen is not None:
                gstate = gen.get_state()
            return {"kind": "python", "position": self._py_pos, "num_samples": n,
                    "generator_state": gstate}
        if self._live is not None:
            st = {"kind": self.sampler.kind, **self._live.state()}
        else:
            st = dict(self.sampler._state_dict())
        st["num_samples"] = n
        return st

    def load_state_dict(self, state: dict) -> None:
        """Restores a position: the next iteration continues right after it. Raises
        ValueError naming the field of a state that does not fit this loader."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        driven = isinstance(self._py, _SamplerDriver)
        mine = "python" if self._py is not None and not driven else self.sampler.kind
        kind = state.get("kind", mine)
        if kind != mine:
            raise ValueError(f"state['kind']: the state of a {kind!r} sampler given to a "
                             f"loader with a {mine!r} sampler")
        n = state.get("num_samples")
        if n is not None and int(n) != len(self.dataset):
            raise ValueError(f"state['num_samples']: the state was saved over {n} samples, "
                             f"this loader's dataset has {len(self.dataset)}")
        keys = ("position",) if self._py is not None and not driven else \
            ("seed", "epoch", "position")
        for key in keys:
            v = state.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"state[{key!r}] must be an integer >= 0, got {v!r}")
        if driven:
            sm = self.sampler
            limit = max(sm.epoch_batches, len(sm) * sm.world_size)
            if int(state["position"]) > limit:
                raise ValueError(f"state['position']={state['position']} is past the end of "
                                 f"epoch {state['epoch']} ({limit} global batches)")
            self.close()
            self._py.load_state_dict(state)
            return
        if self._py is not None:
            self._load_py_state(state)
            return
        self.close()
        old = self.sampler._state_dict()
        self.sampler._load_state_dict(state)
        sm = self.sampler
        limit = max(sm.epoch_batches, len(sm) * sm.world_size)
        if int(state["position"]) > limit:
            self.sampler._load_state_dict(old)
            raise ValueError(f"state['position']={state['position']} is past the end of epoch "
                             f"{state['epoch']} ({limit} global batches)")
        self._epoch = int(state["epoch"])
        self._resume = True
        self._fresh = True

    def _load_py_state(self, state: dict) -> None:
        pos = int(state["position"])
        try:
            nb = len(self)
        except TypeError:
            nb = None
        if nb is not None and pos > nb:
            raise ValueError(f"state['position']={pos} is past the end of the epoch "
                             f"({nb} batches)")
        gstate = state.get("generator_state")
        gen = self._py.generator()
        if gstate is not None:
            if gen is None:
                raise ValueError("state['generator_state']: this loader's sampler has no "
                                 "torch.Generator to restore it into")
            gen.set_state(gstate)
        self.close()
        self._py_skip = pos
        self._py_pos = 0
        self._py_gen_state = None

    # -- iteration -------------------------------------------------------------------------
    def _main_live(self) -> bool:
        it = self._main() if self._main is not None else None
        return it is not None and not it.done

    def __iter__(self) -> Iterator[Batch]:
        """One pass (see the class doc): the main pass when no other iterator of this loader
        is live, else an independent side pass."""
        if self._main_live():
            return _Pass(self._side_pass())
        if self._py is not None:
            it = _Pass(None)
            it.gen = self._py_main_pass()
        else:
            it = _Pass(None)
            it.gen = self._c_main_pass(self._start_main())
        self._main = weakref.ref(it)
        return it

    def _start_main(self):
        """Decides the epoch of the next main pass and gives the C loader that reads it."""
        self.dataset._check_process()
        resume, self._resume = self._resume, False
        if resume and self.sampler.remaining == 0 and not self._epoch_set:
            resume = False  # a state saved at the end of a pass: the next pass follows it
            epoch = self._epoch + 1
        elif resume or self._fresh:
            epoch = self._epoch
        else:
            epoch = self._epoch if self._epoch_set else self._epoch + 1
        self._fresh = False
        self._epoch = epoch
        if self._parked == epoch and not resume and self._live is not None:
            loader = self._live  # read on from the pass before (see __init__)
        else:
            self.close()
            if not resume:
                self.sampler._set_epoch(epoch)
            loader = self._open_loader(self.sampler, more_epochs=-1)
            self._live = loader
        self._parked = None
        return loader

    def _open_loader(self, sampler, more_epochs: int):
        """A C loader over ``sampler`` with this loader's placement; a fallback to host
        memory (no CUDA runtime zbatch can load) is warned about once, and torch then copies
        each batch as before."""
        kw = {}
        if self._placement != "host":
            from ._cuda import current_stream_of, loaded_cudart
            index = _device_index(self.device)
            kw = dict(placement=self._placement, cuda_library=loaded_cudart(),
                      cuda_device=index, num_streams=self.num_streams)
            self._stream_of = current_stream_of(index)
        loader = _zbatch._Loader(self.dataset._c, sampler._c, self.prefetch_factor, self.depth,
                                 self._transforms, more_epochs=more_epochs, same_epoch=False,
                                 **kw)
        placed = loader.placement()
        if placed[0] != self._placement and self._placed is None:
            import warnings
            warnings.warn(f"zbatch: batches stay in pageable host memory ({placed[1]}); "
                          "torch copies each one instead", stacklevel=4)
        self._placed = placed
        return loader

    def _take(self, loader):
        """The C loader's next-batch call: pinned and device batches come as _DeviceBatch
        (their release fences the consumer's stream before their memory is reused)."""
        return loader.next if loader.placement()[0] == "host" else loader.next_device

    @property
    def placement(self) -> str:
        """Where the C loader puts batches: "host", "pinned" (page-locked host memory) or
        "device"; after a fallback "host" (see :attr:`placement_reason`). Batches of a Python
        sampler are read on the host ("host"), and torch copies them."""
        if self._py is not None:
            return "host"
        return self._placed[0] if self._placed else self._placement

    @property
    def placement_reason(self) -> Optional[str]:
        """Why the loader fell back to host memory, or None."""
        return self._placed[1] if self._placed else None

    def _c_main_pass(self, loader) -> Iterator[Batch]:
        ended = False
        try:
            # binds no batch in this frame: one the consumer drops is released at once
            yield from map(self._finish, iter(self._take(loader), None))
            ended = True
        finally:
            if self._live is loader and ended:
                # the pass ran to its end: the loader reads on into the likely next epoch
                self._parked = self._epoch + 1
            elif self._live is loader:
                self.close()  # keeps the final position for state_dict
            else:
                loader.close()

    def _side_pass(self) -> Iterator[Batch]:
        if self._py is not None:
            yield from self._py_pass(getattr(self._py, "side_batches", self._py.batches)(),
                                     main=False)
            return
        self.dataset._check_process()
        sampler = self.sampler._clone()
        sampler._c.set_epoch(self._epoch)
        loader = self._open_loader(sampler, more_epochs=0)
        try:
            yield from map(self._finish, iter(self._take(loader), None))
        finally:
            loader.close()

    def _py_main_pass(self) -> Iterator[Batch]:
        if isinstance(self._py, _SamplerDriver):
            yield from self._py_pass(self._py.batches(), main=True)
            return
        gen = self._py.generator()
        self._py_gen_state = gen.get_state() if gen is not None else None
        skip, self._py_skip = self._py_skip, 0
        self._py_pos = skip
        batches = self._py.batches()
        for _ in range(skip):
            if next(batches, None) is None:
                break
        for batch in self._py_pass(batches, main=True):
            self._py_pos += 1
            yield batch
        # a whole pass: the state is the start of the next one
        self._py_pos = 0
        self._py_gen_state = None

    def _py_pass(self, batches, main: bool) -> Iterator[Batch]:
        """Batches of ids from a Python sampler, read ahead on threads (``depth`` readers,
        ``depth * prefetch_factor`` batches in flight), yielded in sampler order."""
        from concurrent.futures import ThreadPoolExecutor
        ds = self.dataset
        n = len(ds)
        window = self.depth * self.prefetch_factor
        inflight: collections.deque = collections.deque()
        workers = getattr(ds, "_prefetch_workers", self.depth)
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zbatch-sampler")
        driver = self._py if main and isinstance(self._py, _SamplerDriver) else None
        exhausted = False
        try:
            while True:
                while not exhausted and len(inflight) < window:
                    ids = next(batches, None)
                    if ids is None:
                        exhausted = True
                        break
                    inflight.append(pool.submit(ds._read_raw, _ids_array(ids, n),
                                                self._transforms))
                if not inflight:
                    return
                batch = self._finish(inflight.popleft().result())
                if driver is not None:
                    driver.consumed()
                yield batch
        finally:
            for f in inflight:
                f.cancel()
            pool.shutdown(wait=True)

    def _finish(self, raw) -> Any:
        pinned = self._placed is not None and self._placed[0] != "host"
        if not isinstance(raw, dict) and not raw.on_device:
            # a pinned batch: released when its last tensor goes, fencing torch's current
            # stream then (docs/GPU.md, "Stream semantics")
            raw.release_on(self._stream_of)
            raw = raw.host()
        if not isinstance(raw, dict):   # a _DeviceBatch: tensors already on the device
            from ._cuda import DeviceBatch
            batch = DeviceBatch(raw, self.dataset.layout, self.dataset.n_vars, self.device,
                                densify=self.densify == "device")
        elif self.output == "nvalchemi":
            from ._nvbatch import convert
            batch = convert(raw)
            if self.pin_memory and not pinned:
                batch = batch.pin_memory()
            if self.device != "cpu":
                batch = batch.to(self.device, non_blocking=self.pin_memory or pinned)
        else:
            batch = Batch(raw, self.dataset.layout, self.dataset.n_vars, self.output)
            if self.output == "torch" and (self.device != "cpu" or self.pin_memory):
                batch = _to_device(batch, self.device, self.pin_memory and not pinned,
                                   self.pin_memory or pinned)
                if self.densify == "device":
                    from ._cuda import scatter_dense
                    x = batch["X"]
                    batch._items["X_dense"] = scatter_dense(
                        x.crow_indices(), x.col_indices(), x.values(), x.shape[0], x.shape[1],
                        x.values().shape[0])
        if self._batch_compose.transforms:
            batch = self._batch_compose(batch)
        if self.collate_fn is not None:
            batch = self.collate_fn(batch)
        return batch

    def close(self) -> None:
        """Stops the worker threads of the main iteration in progress or of a loader reading
        on past the last pass (also on garbage collection); the position stays. A side
        iterator stops when it ends or is dropped."""
        self._main = None
        if self._py is not None:
            return
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


class _Pass:
    """One iterator of a DataLoader: a generator that is closed when the iterator ends, is
    closed or is dropped (so a loader knows when its main iterator is gone)."""

    def __init__(self, gen):
        self.gen = gen
        self.done = False

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self):
        if self.done:
            raise StopIteration
        try:
            return next(self.gen)
        except BaseException:
            self.done = True
            raise

    def close(self) -> None:
        self.done = True
        if self.gen is not None:
            self.gen.close()

    def __del__(self):  # noqa: D105
        try:
            self.close()
        except Exception:
            pass


class _SamplerDriver:
    """A zbatch sampler driven from Python (for a reader dataset): the epochs of the C
    pipeline (each pass without set_epoch runs the next epoch) and the exact position of
    the last batch handed out (batches are drawn ahead of it)."""

    def __init__(self, sampler):
        self.sampler = sampler
        self._epoch = sampler.epoch
        self._fresh, self._epoch_set, self._resume = True, False, False
        self._state = sampler._state_dict()
        self._drawn: collections.deque = collections.deque()

    def batches(self) -> Iterator:
        s = self.sampler
        if self._resume and s.remaining == 0 and not self._epoch_set:
            self._resume, self._fresh = False, False   # saved at the end: the next epoch
            self._epoch += 1
            s._set_epoch(self._epoch)
        elif not self._resume:
            if not (self._fresh or self._epoch_set):
                self._epoch += 1
            s._set_epoch(self._epoch)
        self._resume = self._fresh = False
        self._drawn.clear()
        self._state = s._state_dict()
        return self._draw(iter(s))

    def _draw(self, it) -> Iterator:
        for ids in it:
            self._drawn.append(self.sampler._state_dict())
            yield ids

    def consumed(self) -> None:
        self._state = self._drawn.popleft()

    def side_batches(self) -> Iterator:
        return iter(self.sampler._clone())

    def state_dict(self) -> dict:
        return dict(self._state)

    def load_state_dict(self, state: dict) -> None:
        self.sampler._load_state_dict(state)
        self._state = self.sampler._state_dict()
        self._epoch = int(state["epoch"])
        self._resume = True

    def set_epoch(self, epoch: int) -> None:
        self.sampler._set_epoch(epoch)
        self._epoch, self._epoch_set, self._resume = epoch, True, False
        self._state = self.sampler._state_dict()

    def num_batches(self) -> int:
        return len(self.sampler)

    def generator(self):
        return None


class _PySampler:
    """A sampler that is not one of zbatch's: a torch Sampler / any iterable of ids (batched
    here by batch_size / drop_last) or, with batch_size None, a batch sampler (an iterable
    of lists of ids)."""

    def __init__(self, obj, batch_size: Optional[int], drop_last: bool):
        if not hasattr(obj, "__iter__"):
            what = "batch_sampler" if batch_size is None else "sampler"
            raise TypeError(f"{what} must be a sampler name, a zbatch sampler or an iterable of "
                            f"{'lists of ' if batch_size is None else ''}sample ids, got "
                            f"{type(obj).__name__}")
        self.obj = obj
        self.batch_size = batch_size
        self.drop_last = drop_last

    def batches(self) -> Iterator:
        it = iter(self.obj)
        if self.batch_size is None:
            return it
        bs, drop = self.batch_size, self.drop_last

        def gen():
            while True:
                chunk = list(itertools.islice(it, bs))
                if not chunk or (drop and len(chunk) < bs):
                    return
                yield chunk
        return gen()

    def num_batches(self) -> int:
        n = len(self.obj)  # TypeError for a sampler without a length, as in torch
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def generator(self):
        """The torch.Generator that decides the order (the sampler's, or its inner
        sampler's for a BatchSampler), or None."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        for o in (self.obj, getattr(self.obj, "sampler", None)):
            g = getattr(o, "generator", None)
            if isinstance(g, torch.Generator):
                return g
        return None


def _ids_array(ids, n: int) -> np.ndarray:
    arr = np.asarray(ids.numpy() if hasattr(ids, "numpy") else ids)
    if arr.ndim != 1:
        raise TypeError(f"a batch of sample ids must be a 1-d list of integers, got {ids!r} "
                        "(a sampler yielding single ids goes in sampler=, not batch_sampler=)")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"sample ids must be integers, got {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= n):
        bad = arr[(arr < 0) | (arr >= n)][0]
        raise IndexError(f"sample id {bad} out of range for a dataset of {n} samples")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def _check_device(device, pin: bool, output: str):
    dev = str(device)
    if (dev != "cpu" or pin) and output not in ("torch", "nvalchemi"):
        what = f"device={dev!r}" if dev != "cpu" else "pin_memory=True"
        raise ValueError(f"{what} needs output='torch': output={output!r} yields numpy / scipy "
                         "arrays in host memory")
    if dev == "cpu" and not pin:
        return dev, pin
    import torch
    try:
        tdev = torch.device(dev)
    except RuntimeError as e:
        raise ValueError(f"device={dev!r}: {e}") from None
    if tdev.type == "cuda" and not torch.cuda.is_available():
        from ._cuda import torch_cuda_problem
        raise ValueError(torch_cuda_problem(dev))
    if pin and not torch.cuda.is_available():
        import warnings
        warnings.warn("pin_memory=True but no accelerator is available: pinned memory is not "
                      "used", stacklevel=3)
        pin = False
    return dev, pin


_SIZE_SEGMENTS = {"num_atoms": ("max_atoms", "atoms"), "num_edges": ("max_edges", "edges"),
                  "nnz": ("max_nnz", "X")}


def _dataset_sampler_args(dataset: Dataset, name: str, kw: dict) -> dict:
    """Fills sampler arguments that come from the dataset: per-sample sizes for "size_aware"
    (from the pointer arrays, no values read), class codes for "weighted" with
    ``class_field``, and a MultiDataset's child lengths for "multi" / "multi_sample"."""
    kw = dict(kw)
    if name in ("multi", "multi_sample") and "sizes" not in kw and hasattr(dataset, "sizes"):
        kw["sizes"] = list(dataset.sizes)   # a MultiDataset's children, in order
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


def _to_device(batch: Batch, device: str, pin: bool, non_blocking: bool) -> Batch:
    """torch's copy of every tensor (pinning it first when ``pin``): the path of Python
    samplers and of a loader that fell back to host memory."""
    import torch
    batch._materialize()
    for k, v in list(batch._items.items()):
        if isinstance(v, torch.Tensor):
            if pin and not v.is_sparse and v.layout == torch.strided:
                v = v.pin_memory()
            batch._items[k] = v.to(device, non_blocking=non_blocking)
    return batch


def _device_index(device: str) -> int:
    """The CUDA device ordinal of "cuda" / "cuda:N" (the current device for "cuda")."""
    import torch
    d = torch.device(device)
    if d.type != "cuda":
        return 0
    return d.index if d.index is not None else torch.cuda.current_device()
