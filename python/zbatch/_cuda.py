"""Batches on a CUDA device (docs/GPU.md).

The C loader copies each batch to the device on its own CUDA streams (zbatch_cuda.h); this
module turns such a batch into torch tensors without copying: each tensor is a view of the
batch's device block through ``__cuda_array_interface__``, and holds the batch, which is
released (its memory reused after the consumer stream's work queued so far) when the last
tensor goes. Before anything touches the tensors, the consumer's current stream waits for
the copies on the GPU (never on the host).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import numpy as np

from .dataset import _SEGMENT_KEYS, Batch


def loaded_cudart() -> Optional[str]:
    """The path of a CUDA runtime (libcudart) already loaded in this process (PyTorch's), or
    None: zbatch then uses the same runtime, so its streams and events are torch's."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "/libcudart.so" in path:
                    return path
    except OSError:  # pragma: no cover - not Linux
        pass
    return None


def current_stream_of(index: int) -> Callable[[], int]:
    """A callable giving torch's current stream on CUDA device ``index`` (a cudaStream_t as an
    int). A pinned batch calls it when its last tensor is freed: the loader reuses the batch's
    page-locked memory only after the work queued on that stream so far (a
    ``.to("cuda", non_blocking=True)`` copy out of it) has run."""
    import torch

    def stream() -> int:
        return torch.cuda.current_stream(index).cuda_stream
    return stream


def torch_cuda_problem(device: str) -> Optional[str]:
    """Why ``device`` cannot be used by torch here, or None."""
    import torch
    if torch.cuda.is_available():
        return None
    build = "a CPU-only build" if torch.version.cuda is None else \
        f"built for CUDA {torch.version.cuda}, but no CUDA device or driver is present"
    return (f"device={device!r} needs CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}: {build}); use device='cpu'")


class _CudaArray:
    """Device memory of a batch as ``__cuda_array_interface__`` (version 2: the consumer
    orders its own work, which the stream wait of :class:`DeviceBatch` does); it holds the
    batch's owner, and so does every tensor made from it."""

    __slots__ = ("__cuda_array_interface__", "owner")

    def __init__(self, ptr: int, shape: tuple, typestr: str, owner: Any):
        self.__cuda_array_interface__ = {"shape": tuple(int(s) for s in shape),
                                         "typestr": typestr, "data": (int(ptr), False),
                                         "version": 2, "strides": None}
        self.owner = owner


class DeviceBatch(Batch):
    """A :class:`zbatch.dataset.Batch` whose tensors live on a CUDA device: X as a sparse CSR
    tensor (or dense), per-sample fields, pointer arrays ("atoms_ptr", "edges_ptr", ...),
    ``batch_idx`` for graphs, ``index``; string columns stay Python lists. With
    ``densify=True`` X is also scattered into a dense float32 ``X_dense`` on the device."""

    def __init__(self, db: Any, layout: str, n_vars: int, device: Any, densify: bool = False,
                 stream: Optional[int] = None):
        import torch
        self._db = db
        self._device = torch.device(device)
        self._densify = densify
        # the consumer's current stream (or `stream`, a cudaStream_t as an int) waits for the
        # copies on the GPU before any work on them
        if stream is None:
            stream = torch.cuda.current_stream(self._device).cuda_stream
        db.wait(stream)
        self._ptrs = db.pointers()
        super().__init__(db.host(), layout, n_vars, "torch")

    def _tensor(self, ptr: int, typestr: str, shape: tuple):
        import torch
        return torch.as_tensor(_CudaArray(ptr, shape, typestr, self._db), device=self._device)

    def _build(self) -> None:
        import torch
        raw, p, items = self._raw, self._ptrs, self._items
        B = memoryview(raw["index"]).nbytes // 8
        host_segs = {name: np.frombuffer(buf, dtype=np.int64)
                     for name, buf in raw["segments"].items()}
        segs = {name: self._tensor(p["segments"][name], "<i8", (B + 1,)) for name in host_segs}
        fields = {}
        for name, (buf, typestr, shape, _kind, _seg) in raw["fields"].items():
            if isinstance(buf, list):
                fields[name] = np.array(buf, dtype=object)   # strings stay on the host
            else:
                fields[name] = self._tensor(p["fields"][name], typestr, shape)
        # ids are below 2**63: the same bits read as int64 (torch's index dtype)
        items["index"] = self._tensor(p["index"], "<i8", (B,))
        if "dataset" in raw:
            items["dataset"] = self._tensor(p["dataset"], "<i4", (B,))
        for name, ptr in segs.items():
            if f"{name}/data" in fields and f"{name}/indices" in fields:
                data, indices = fields.pop(f"{name}/data"), fields.pop(f"{name}/indices")
                cols = indices.to(torch.int64)   # on the device, on the consumer's stream
                with warnings.catch_warnings():  # "sparse CSR support is in beta"
                    warnings.simplefilter("ignore", UserWarning)
                    items[name] = torch.sparse_csr_tensor(ptr, cols, data,
                                                          size=(B, self._n_vars),
                                                          check_invariants=False)
                if self._densify and name == "X":
                    nnz = int(host_segs[name][-1])
                    items["X_dense"] = scatter_dense(ptr, cols, data, B, self._n_vars, nnz)
        for name, ptr in segs.items():
            if name in _SEGMENT_KEYS:
                items[_SEGMENT_KEYS[name]] = ptr
            elif name not in items:
                items[f"{name}_ptr"] = ptr
        if self._layout == "atomic" and "atoms" in segs:
            ptr = segs["atoms"]
            natoms = int(host_segs["atoms"][-1])
            items["batch_idx"] = torch.repeat_interleave(
                torch.arange(B, device=self._device), ptr.diff(), output_size=natoms)
        for name, arr in fields.items():
            items[name] = arr


def scatter_dense(crow, cols, values, nrows: int, ncols: int, nnz: int):
    """A CSR matrix scattered into a dense float32 [nrows, ncols] on its device: one
    repeat_interleave for the row of each value (its size given, so the host does not wait)
    and one index_put_."""
    import torch
    dense = torch.zeros((nrows, ncols), dtype=torch.float32, device=values.device)
    rows = torch.repeat_interleave(torch.arange(nrows, device=values.device), crow.diff(),
                                   output_size=nnz)
    dense.index_put_((rows, cols), values.to(torch.float32))
    return dense
