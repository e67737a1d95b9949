"""zbatch.convert: AnnData inputs into a pre-shuffled, sharded collection.

The work is libzbatch's (include/zbatch_convert.h): a plan, then three phases of independent
tasks (prepare, scatter, gather), then a finishing step. Without a Dask client the library's own
threads run the tasks; with one, the same tasks run as Dask tasks on the cluster's workers (each
finds the plan in the output directory, which the workers must see), and the output has the same
bytes either way.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from . import _zbatch
from ._remote import writable_options
from .dataset import _mmap_bytes

__all__ = ["convert"]

PathLike = Union[str, "os.PathLike[str]"]

_PHASES = ("prepare", "scatter", "gather")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40,
          "TIB": 1 << 40}


def _size(value: Union[int, str, None], what: str) -> int:
    """Bytes from an int or a size string ("4G", "512MB"; binary units)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int or a size string such as '4G'")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{what} must be positive, not {value}")
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"{what}={value!r}: give bytes or a size such as '4G' or '512M'")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _paths(inputs: Union[PathLike, Iterable[PathLike]]) -> list:
    if isinstance(inputs, (str, os.PathLike)):
        return [os.fspath(inputs)]
    out = [os.fspath(p) for p in inputs]
    if not out:
        raise ValueError("convert needs at least one input")
    return out


def _count(value: Optional[int], what: str, *, allow_zero: bool = False) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 0 or (value == 0 and not allow_zero) or value >= 2**64:
        raise ValueError(f"{what}={value} is out of range")
    return value


class _Progress:
    """tqdm bars, one per phase (or a user callable receiving a dict per update)."""

    def __init__(self, progress, unit: str = "cells"):
        self.user = progress if callable(progress) else None
        self.enabled = bool(progress)
        self.unit = unit
        self.bars: dict = {}

    def __call__(self, phase, tasks_done, tasks_total, cells_done, cells_total, bytes_done,
                 bytes_total):
        if self.user:
            self.user({"phase": _PHASES[phase], "tasks_done": tasks_done,
                       "tasks_total": tasks_total, "cells_done": cells_done,
                       "cells_total": cells_total, "bytes_done": bytes_done,
                       "bytes_total": bytes_total})
            return
        if not self.enabled:
            return
        from tqdm.auto import tqdm
        bar = self.bars.get(phase)
        if bar is None:
            for b in self.bars.values():
                b.close()
            bar = self.bars[phase] = tqdm(total=cells_total, desc=f"zbatch convert: {_PHASES[phase]}",
                                          unit=self.unit, unit_scale=True, smoothing=0.1)
        bar.update(cells_done - bar.n)

    def close(self):
        for b in self.bars.values():
            b.close()
        self.bars.clear()


_DATA_DTYPES = ("uint8", "uint16", "float32")


def _data_dtype(value: Any) -> str:
    """The option's name for ``data_dtype`` (as :func:`zbatch.write_anndata` takes it)."""
    if value is None:
        return "auto"
    if isinstance(value, str) and value == "keep":
        return "keep"
    import numpy as np
    try:
        name = np.dtype(value).name
    except TypeError:
        name = None
    if name not in _DATA_DTYPES:
        raise ValueError(f"data_dtype={value!r}: None (the narrowest exact type), 'keep', or one "
                         f"of {', '.join(_DATA_DTYPES)}")
    return name


def _index_dtype(value: Optional[bool]) -> str:
    if value is None:
        return "auto"
    if not isinstance(value, bool):
        raise TypeError(f"narrow_indices must be None, True or False, not {value!r}")
    return "narrow" if value else "int32"


def _env_flag(name: str) -> bool:
    """A switch from the environment (read here: the C library reads none): off when unset,
    "" or "0", on otherwise."""
    return os.environ.get(name, "") not in ("", "0")


def _run_task(output: str, phase: int, i: int, threads: int, memory: int,
              input_mmap_bytes: Optional[int] = None, buffered_output: bool = False) -> bool:
    """One task, in whichever process Dask put it (the plan is read from `output`)."""
    return _zbatch.convert_task(output, phase, i, threads, memory, input_mmap_bytes,
                                buffered_output)


def _run_on_dask(client, inputs, output, opts, progress: _Progress, retries: int) -> None:
    from dask.distributed import as_completed

    plan = _zbatch.convert_plan(inputs, output, opts)
    memory = opts["memory_bytes"] or (4 << 30)
    for phase, n in enumerate(plan["tasks"]):
        if n == 0:
            continue
        # each task gets the memory budget the plan was made with; a worker runs one per thread
        futures = [client.submit(_run_task, output, phase, i, 1, memory, opts["input_mmap_bytes"],
                                 opts["buffered_output"], retries=retries,
                                 pure=False, key=f"zbatch-convert-{_PHASES[phase]}-{i}-{os.getpid()}")
                   for i in range(n)]
        done = 0
        for fut in as_completed(futures):
            fut.result()  # re-raises a task's ZbatchError here
            done += 1
            progress(phase, done, n, done, n, done, n)  # Dask reports tasks, not cells
    _zbatch.convert_finish(inputs, output, opts)


def convert(inputs: Union[PathLike, Sequence[PathLike]], output: PathLike, *,
            dataset_size: Optional[int] = None, var_join: str = "outer",
            genes: Union[PathLike, Sequence[str], None] = None,
            obs: Optional[Sequence[str]] = None, x: str = "X",
            layers: Optional[Sequence[str]] = None, memory: Union[int, str] = "4G",
            seed: int = 0, shuffle: bool = True, zarr_format: int = 3,
            codec: Optional[str] = None, chunk: Optional[int] = None,
            shard: Optional[int] = None, num_threads: Optional[int] = None,
            data_dtype: Any = None, narrow_indices: Optional[bool] = None,
            progress: Union[bool, Callable[[dict], Any]] = True, client=None,
            retries: int = 2, work_dir: Optional[PathLike] = None,
            storage_options: Optional[dict] = None) -> dict:
    """Converts AnnData inputs into a pre-shuffled collection of sharded AnnData datasets.

    ``inputs`` are ``.h5ad`` files or anndata Zarr stores; ``output`` is a new (or empty)
    directory. Every input cell lands at a uniformly random position of the collection (a
    function of ``seed``), in datasets ``dataset_0``, ``dataset_1``, ... of ``dataset_size``
    cells each, written in the layout annbatch's ``DatasetCollection`` and ``Loader`` read.
    Genes are aligned by name (``var_join`` ``"outer"`` or ``"inner"``, or an explicit
    ``genes`` list or file), categorical columns get one category table, and every cell keeps
    its source in the obs columns ``src_path`` and ``src_row``.

    Values are stored in the narrowest type that holds every one of them exactly, chosen over
    all inputs so that every dataset gets the same types (``data_dtype``, ``narrow_indices``
    as in :func:`zbatch.write_anndata`):

    data_dtype
        ``None`` (default): ``uint8`` when every value of a matrix (``X``, each layer) is an
        integer in [0, 255] (raw counts), ``uint16`` in [0, 65,535], else the inputs' type
        (promoted as numpy does). ``"keep"``: the inputs' type. ``"uint8"``, ``"uint16"``:
        that type; a value it cannot hold exactly fails the conversion with an error naming
        the input, row and value. ``"float32"``: converted as numpy's ``astype``.
    narrow_indices
        ``None`` (default): column ids as ``uint8``/``uint16`` up to 65,535 genes, else
        ``int32``. ``True``: anndata's smallest unsigned type (``uint32`` above 65,535).
        ``False``: ``int32``.

    The chosen types are in the returned manifest's ``"dtypes"`` (``{"X/data": "uint8",
    "X/indices": "uint16", ...}``). ``codec`` (default ``None``) is as in
    :func:`zbatch.write_anndata`: without one, uint8/uint16 data and indices are written
    ``"blosc:lz4:5:noshuffle"`` and every other array ``"blosc:lz4:5:shuffle"``.

    Memory stays near ``memory`` (bytes or a size such as ``"4G"``) whatever the inputs' size.
    Inputs that fit ``ZBATCH_MMAP_BYTES`` (default 1 GiB) and half of ``memory`` are mapped
    for reading rows, counted in that memory; ``ZBATCH_MMAP_BYTES=0`` reads them with pread
    (for inputs that may be rewritten in place meanwhile: docs/CONVERT.md).
    For comparisons, ``ZBATCH_CONVERT_SCRATCH=1`` sends every cell through the scratch files
    and ``ZBATCH_CONVERT_BUFFERED=1`` writes the output without direct I/O (docs/CONVERT.md);
    the bytes are the same.
    A conversion that was interrupted resumes when called again with the same arguments and
    gives the same bytes as an uninterrupted one.

    With a Dask ``client`` (``dask.distributed.Client``), the tasks run on the cluster's
    workers with ``retries`` retries each; the workers must see ``output`` and the inputs at
    the same paths. The result has the same bytes as without a client.

    ``output`` may be an ``s3://bucket/prefix`` URL (``storage_options`` as for
    :func:`zbatch.open`): the scratch files stay in the local ``work_dir`` (default: a
    directory named after the URL in the temporary directory, so that calling again after an
    interruption resumes), the datasets, the root group and the manifest go into the bucket,
    each dataset's objects before the metadata that makes it openable and the collection's
    root ``zarr.json`` only after every dataset was read back and matched its checksum
    (docs/REMOTE.md). ``work_dir`` also moves a local output's work elsewhere.

    Returns the manifest (``output/zbatch-manifest.json``): the options, each input's size,
    CRC-64 and cell count, and each dataset's cells, nonzeros and CRC-64, verified against the
    files.

    Example::

        >>> zbatch.convert(["a.h5ad", "b.h5ad"], "atlas.zarr", dataset_size=2**21, memory="8G")
        >>> loader = zbatch.DataLoader(zbatch.open("atlas.zarr"), batch_size=4096)
    """
    paths = _paths(inputs)
    out = os.fspath(output)
    remote = writable_options(out, storage_options)
    if remote is not None and client is not None:
        raise ValueError(f"{out}: the Dask path writes local outputs only; convert into s3:// "
                         "without a client (the work directory stays local)")
    if work_dir is not None and client is not None:
        raise ValueError("work_dir with a Dask client: the workers find the plan in "
                         "OUTPUT/.zbatch-convert, so leave work_dir out")
    if work_dir is None and remote is not None:
        work_dir = _zbatch.convert_default_work_dir(out, tempfile.gettempdir())
    if var_join not in ("outer", "inner"):
        raise ValueError(f"var_join must be 'outer' or 'inner', not {var_join!r}")
    if zarr_format not in (2, 3):
        raise ValueError(f"zarr_format must be 2 or 3, not {zarr_format!r}")
    if isinstance(obs, str) or isinstance(layers, str):
        raise TypeError("obs and layers are lists of names")
    threads = _count(num_threads, "num_threads", allow_zero=True)
    if threads > 256:
        raise ValueError(f"num_threads={threads}: at most 256")
    gene_file = None
    tmp = None
    if genes is not None and not isinstance(genes, (str, os.PathLike)):
        names = [str(g) for g in genes]
        if any("\n" in g or "\r" in g for g in names):
            raise ValueError("gene names cannot contain line breaks")
        tmp = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8")
        tmp.write("".join(g + "\n" for g in names))
        tmp.close()
        gene_file = tmp.name
    elif genes is not None:
        gene_file = os.fspath(genes)
    opts = {
        "dataset_size": _count(dataset_size, "dataset_size"),
        "var_join": var_join,
        "genes": gene_file,
        "obs": None if obs is None else [str(c) for c in obs],
        "x": str(x),
        "layers": [str(name) for name in (layers or [])],
        "memory_bytes": _size(memory, "memory"),
        "seed": _count(seed, "seed", allow_zero=True),
        "shuffle": bool(shuffle),
        "zarr_format": zarr_format,
        "codec": codec,
        "x_chunk": _count(chunk, "chunk"),
        "x_shard": None if shard is None else (-1 if shard == 0 else _count(shard, "shard")),
        "num_threads": threads,
        "data_dtype": _data_dtype(data_dtype),
        "index_dtype": _index_dtype(narrow_indices),
        "work_dir": None if work_dir is None else os.fspath(work_dir),
        "remote": remote,
        # the one switch for mappings, as for the stores: the bytes of inputs the gather may map
        # (None: the library's default; 0 reads every row with pread; docs/CONVERT.md)
        "input_mmap_bytes": _mmap_bytes(None),
        # switches for comparisons, read here as the command reads them (docs/CONVERT.md)
        "scratch_path": _env_flag("ZBATCH_CONVERT_SCRATCH"),
        "buffered_output": _env_flag("ZBATCH_CONVERT_BUFFERED"),
    }
    bar = _Progress(progress, "cells" if client is None else "tasks")
    try:
        if client is None:
            _zbatch.convert_run(paths, out, opts, bar if progress else None)
        else:
            _run_on_dask(client, paths, out, opts, bar, int(retries))
    finally:
        bar.close()
        if tmp is not None:
            os.unlink(tmp.name)
    if remote is not None:
        return json.loads(_zbatch.store_read(out, remote, "zbatch-manifest.json"))
    with open(os.path.join(out, "zbatch-manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def measure_limit(inputs, output: PathLike, **kwargs) -> dict:
    """This machine's limit for a conversion (see ``zbatch convert --limit``): the seconds to
    read the inputs alone and to compress the output's X alone."""
    paths = _paths(inputs)
    opts = {"memory_bytes": _size(kwargs.get("memory", "4G"), "memory"),
            "num_threads": _count(kwargs.get("num_threads"), "num_threads", allow_zero=True),
            "codec": kwargs.get("codec"), "zarr_format": kwargs.get("zarr_format", 3),
            "dataset_size": _count(kwargs.get("dataset_size"), "dataset_size"),
            "buffered_output": _env_flag("ZBATCH_CONVERT_BUFFERED")}
    return _zbatch.convert_limit(paths, os.fspath(output), opts)
