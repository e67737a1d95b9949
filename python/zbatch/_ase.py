"""Converting structures that ASE reads (extended XYZ, ASE databases, trajectories and every
other format of ``ase.io``) into an nvalchemi AtomicData store (shared FORMATS.md §8), with
neighbour lists computed by libzbatch from a cutoff.

    >>> import zbatch
    >>> zbatch.convert_ase(["train.extxyz"], "train.zarr", cutoff=5.0)
    10000
    >>> ds = zbatch.open("train.zarr")

What a structure becomes (one sample; ``core/`` names are nvalchemi's AtomicData fields):

=========================  =================================================================
``positions`` [n, 3]       ``atoms.positions``
``atomic_numbers`` [n]     ``atoms.numbers`` (int64)
``cell`` [3, 3]            ``atoms.cell`` (zeros for a molecule without a cell)
``pbc`` [3]                ``atoms.pbc``
``neighbor_list`` [E, 2]   (i, j): every ordered pair closer than the cutoff, periodic images
                           included, as ``ase.neighborlist.neighbor_list("ijS")`` lists them;
                           column 0 is the source (centre) atom, column 1 the target
``neighbor_list_shifts``   [E, 3] the integer cell shift S of each pair (int64)
``shifts`` [E, 3]          the Cartesian shift vector ``S @ cell``
calculator results         ``energy``, ``forces``, ``stress`` (3x3, from ASE's Voigt order),
                           ``dipole``, ``charges``; other results (``free_energy``,
                           ``energies``, ``magmoms``, ...) under their own names in ``custom/``
``atoms.info``             ``energy``, ``stress``, ``virials`` (as ``virial``), ``dipole``,
                           ``charge`` when no calculator gave them (the keys nvalchemi's
                           ``AtomicData.from_atoms`` reads); every other numeric or boolean
                           entry as a per-structure field in ``custom/``
``atoms.arrays``           ``forces``, ``charges``, ``momenta``, ``masses`` (as
                           ``atomic_masses``); every other numeric array as a per-atom field
                           in ``custom/``
=========================  =================================================================

Floating-point core fields are stored as float32 (nvalchemi casts every float field to the
dtype of ``positions``); custom fields keep float64. Strings (``config_type``, ...) are not
stored.

The shift convention is nvalchemi-toolkit 0.2.0's own: ``AtomicData.shifts`` is documented as
"Cartesian displacement vectors for each edge (neighbor_list_shifts @ cell)" and
``neighbor_list_shifts`` as "Integer lattice image indices for periodic edges"
(nvalchemi/data/atomic_data.py, nvalchemi/_typing.py), and its models rebuild the edge vector
as ``positions[j] - positions[i] + neighbor_list_shifts @ cell`` (the MACE wrapper's
``adapt_input``, ``filter_neighbor_list`` in nvalchemi/models/_ops/neighbor_filter.py), which
is ASE's D = r_j - r_i + S @ cell with neighbor_list = (i, j). Both are written, since the
models read the integer shifts and the data class documents the Cartesian ones.
"""
from __future__ import annotations

import math
import os
import queue
import shutil
import sys
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import numpy as np

from . import _atomic
from ._neighbors import neighbor_list
from ._zbatch import ZbatchError

__all__ = ["convert_ase"]

PathLike = Union[str, "os.PathLike[str]"]

# The fields every sample gets from the structure itself and its neighbour list; no result,
# info entry or array may take these names.
_OWN = frozenset({"positions", "atomic_numbers", "numbers", "cell", "pbc", "neighbor_list",
                  "neighbor_list_shifts", "shifts"})
# Calculator results that become nvalchemi core fields, and which results are per atom.
_RESULT_NAMES = {"energy": "energy", "forces": "forces", "stress": "stress", "dipole": "dipole",
                 "charges": "charges"}
_PER_ATOM_RESULTS = frozenset({"forces", "energies", "stresses", "charges", "magmoms"})
# atoms.info keys that nvalchemi's AtomicData.from_atoms reads, and atoms.arrays keys that are
# nvalchemi core fields under another name.
_INFO_NAMES = {"energy": "energy", "stress": "stress", "virials": "virial",
               "virial": "virial", "dipole": "dipole", "charge": "charge"}
_ARRAY_NAMES = {"masses": "atomic_masses"}
# Tensors that nvalchemi keeps as 3x3 while ASE writes them in Voigt order.
_TENSORS = frozenset({"stress", "virial"})
_KIND_NAMES = {"b": "bool", "i": "int64", "f": "float64"}


def _voigt_to_3x3(v: np.ndarray, what: str) -> np.ndarray:
    """ASE's Voigt order (xx, yy, zz, yz, xz, xy) to the symmetric 3x3 tensor (nvalchemi's
    ``voigt_to_matrix``); a 3x3 or 9-vector is reshaped."""
    if v.shape == (6,):
        xx, yy, zz, yz, xz, xy = v
        return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    if v.size == 9:
        return v.reshape(3, 3)
    raise ValueError(f"{what}: a stress or virial of shape {v.shape} is neither Voigt (6,) "
                     "nor 3x3")


def _numeric(v: Any) -> Optional[np.ndarray]:
    """A value as a storable array (bool, int64 or float64), or None for strings, objects and
    complex numbers."""
    try:
        a = np.asarray(v)
    except Exception:
        return None
    if a.dtype.kind == "b":
        return a
    if a.dtype.kind in "iu":
        return a.astype(np.int64, copy=False)
    if a.dtype.kind == "f":
        return a.astype(np.float64, copy=False)
    return None


def _warn(message: str) -> None:
    """A UserWarning attributed to the caller's line (the first frame outside this package:
    the writer pulls structures through generators, so the depth varies)."""
    here, level = os.path.dirname(os.path.abspath(__file__)), 2
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


def _name_ok(name: str) -> bool:
    # the atomic writer's rule for array names
    return bool(name) and "/" not in name and not name.startswith((".", "__"))


class _Schema:
    """The fields of a store: fixed by the first structure (name -> level and dtype kind; the
    atomic writer checks row shapes); every later structure must carry each of them, integers
    are widened to a float field's type. Fields a later structure adds are dropped with one
    warning each."""

    def __init__(self) -> None:
        self.fields: Optional[dict[str, tuple[str, str]]] = None
        self._dropped: set[str] = set()

    def apply(self, sample: dict[str, tuple[str, np.ndarray]], where: str
              ) -> dict[str, np.ndarray]:
        if self.fields is None:
            self.fields = {k: (lvl, a.dtype.kind) for k, (lvl, a) in sample.items()}
        out = {}
        for name, (level, kind) in self.fields.items():
            if name not in sample:
                raise ValueError(f"{where} has no {name!r}, which the first structure has: "
                                 "every structure of a store needs the same fields")
            lvl, a = sample[name]
            if lvl != level:
                raise ValueError(f"{where}: {name!r} is a {lvl}-level field here and a "
                                 f"{level}-level field in the first structure")
            if a.dtype.kind != kind:
                if kind == "f" and a.dtype.kind in "biu":
                    a = a.astype(np.float64)
                elif kind == "i" and a.dtype.kind == "b":
                    a = a.astype(np.int64)
                else:
                    raise ValueError(f"{where}: {name!r} is {a.dtype} here and "
                                     f"{_KIND_NAMES[kind]} in the first structure")
            out[name] = a
        for name in sample.keys() - self.fields.keys():
            if name not in self._dropped:
                self._dropped.add(name)
                _warn(f"{where} has {name!r}, which the first structure lacks: not stored (the "
                      "first structure fixes the fields)")
        return out

    def levels(self) -> dict[str, str]:
        return {k: lvl for k, (lvl, _) in (self.fields or {}).items()}


def _structure(atoms: Any, cutoff: float, where: str, skipped: set[str]
               ) -> dict[str, tuple[str, np.ndarray]]:
    """The fields of one structure as name -> (level, array)."""
    if not hasattr(atoms, "get_positions") or not hasattr(atoms, "numbers"):
        raise ValueError(f"{where}: ASE returned a {type(atoms).__name__}, not an Atoms")
    positions = np.asarray(atoms.positions, dtype=np.float64)
    n = len(atoms)
    if n == 0 or positions.shape != (n, 3):
        raise ValueError(f"{where} has no atoms (no positions)")
    cell = np.asarray(atoms.cell.array, dtype=np.float64)
    pbc = np.asarray(atoms.pbc, dtype=bool)
    try:
        i, j, S = neighbor_list(positions, cell, pbc, cutoff)
    except ZbatchError as e:
        raise ValueError(f"{where}: {e}") from e
    out: dict[str, tuple[str, np.ndarray]] = {
        "positions": ("atom", positions),
        "atomic_numbers": ("atom", np.asarray(atoms.numbers, dtype=np.int64)),
        "cell": ("system", cell),
        "pbc": ("system", pbc),
        "neighbor_list": ("edge", np.stack([i, j], axis=1)),
        "neighbor_list_shifts": ("edge", S),
        "shifts": ("edge", S.astype(np.float64) @ cell),
    }

    def put(name: str, value: Any, level: str, source: str) -> None:
        if name in out:
            return  # a calculator result wins over info/arrays; the structure over all
        a = _numeric(value)
        core_level = _atomic._CORE_LEVELS.get(name)
        if a is None or not _name_ok(name) or (core_level and core_level != level):
            if name not in skipped:
                skipped.add(name)
                why = ("is not numeric" if a is None else "is not a valid array name"
                       if not _name_ok(name) else f"is nvalchemi's {core_level}-level field")
                _warn(f"{where}: {source} {name!r} {why}: not stored")
            return
        if name in _TENSORS:
            a = _voigt_to_3x3(a, f"{where}: {source} {name!r}")
        if level == "atom" and (a.ndim == 0 or a.shape[0] != n):
            raise ValueError(f"{where}: {source} {name!r} has shape {a.shape}, not one row "
                             f"per atom ({n})")
        out[name] = (level, a)

    calc = getattr(atoms, "calc", None)
    results = getattr(calc, "results", None) or {}
    for key, value in results.items():
        level = "atom" if key in _PER_ATOM_RESULTS else "system"
        put(_RESULT_NAMES.get(key, key), value, level, "calculator result")
    for key, value in atoms.info.items():
        if key not in _OWN:
            put(_INFO_NAMES.get(key, key), value, "system", "info")
    for key, value in atoms.arrays.items():
        if key not in _OWN:
            put(_ARRAY_NAMES.get(key, key), value, "atom", "array")
    return out


def _guess_format(path: str) -> str:
    from ase.io.formats import filetype
    try:
        return str(filetype(path, guess=True))
    except Exception:
        return "?"


def _read(path: str, index: Any, format: Optional[str]) -> Iterator[tuple[int, Any]]:
    """(k, Atoms) from ase.io.iread, with ASE's errors named by file and structure."""
    import ase.io
    from ase.io.formats import UnknownFileTypeError
    k = 0
    try:
        it = ase.io.iread(path, index=index, format=format)
        while True:
            try:
                atoms = next(it)
            except StopIteration:
                if k == 0:  # ASE may guess a format that silently finds nothing
                    _warn(f"{path}: ASE read no structures from it (format "
                          f"{format or _guess_format(path)!r}, index {index!r})")
                return
            yield k, atoms
            k += 1
    except FileNotFoundError:
        raise
    except UnknownFileTypeError as e:
        raise ValueError(f"{path}: ASE cannot tell its format ({e}); pass format=") from e
    except Exception as e:  # each reader raises its own (XYZError, sqlite3.DatabaseError, ...)
        raise ValueError(f"{path}: ASE cannot read structure {k}: "
                         f"{type(e).__name__}: {e}") from e



def _check_cutoff(cutoff: Any) -> float:
    """A neighbour-list cutoff: a finite number of Å above 0 (ValueError otherwise)."""
    if isinstance(cutoff, bool) or not isinstance(cutoff, (int, float, np.integer, np.floating)):
        raise ValueError(f"cutoff must be a number of Å, got {cutoff!r}")
    cutoff = float(cutoff)
    if not (math.isfinite(cutoff) and cutoff > 0):
        raise ValueError(f"cutoff must be a finite number > 0 (Å), got {cutoff}")
    return cutoff


def _check_job(inputs: Any, output: Any, zarr_format: int, batch_size: int, what: str,
               present: Callable[[str], bool], missing: str) -> tuple[list[str], str, int]:
    """The arguments every conversion into the atomic layout shares: (input paths, absolute
    output path, batch size); refuses v2, a batch size below 1, no inputs, an input not
    ``present`` (FileNotFoundError "PATH: ``missing``") and an output that exists (a file, or a
    directory that is not empty)."""
    if int(zarr_format) != 3:
        raise ValueError(f"zarr_format={zarr_format}: the nvalchemi atomic layout is Zarr v3 only")
    batch_size = int(batch_size)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    paths = ([os.fspath(inputs)] if isinstance(inputs, (str, bytes, os.PathLike))
             else [os.fspath(p) for p in inputs])
    if not paths:
        raise ValueError(f"no {what}")
    for p in paths:
        if not present(p):
            raise FileNotFoundError(f"{p}: {missing}")
    out = os.path.abspath(os.fspath(output))
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise FileExistsError(f"{out} already exists")
    return paths, out, batch_size

def convert_ase(inputs: Union[PathLike, Iterable[PathLike]], output: PathLike, *,
                cutoff: float, index: Any = ":", format: Optional[str] = None,
                batch_size: int = 256, zarr_format: int = 3, codec: Optional[str] = None,
                num_threads: int = 2,
                progress: Optional[Callable[[int], Any]] = None) -> int:
    """Converts the structures of ``inputs`` into a new nvalchemi AtomicData store at
    ``output``, with each structure's neighbour list for ``cutoff``; returns the number of
    structures written.

    Parameters
    ----------
    inputs : path or iterable of paths
        Files ASE reads (extended XYZ, ``.db``, ``.traj``, ...), converted in order.
    output : path
        The store's directory; must not exist yet (or be empty).
    cutoff : float
        Neighbour cutoff radius in Å (> 0): pairs with |r_j - r_i + S @ cell| < cutoff.
    index : str, int or slice, default ":"
        Which structures of each file (ASE's ``index``: ``":"`` all, ``"::10"``, ``-1``, ...).
    format : str, optional
        ASE's format name for every input (default: guessed from each file).
    batch_size : int, default 256
        Structures converted and handed to the writer at a time: memory holds one batch (two
        when writing on a second thread), never the whole input.
    zarr_format : int, default 3
        Must be 3: the nvalchemi layout is Zarr v3.
    codec : str, optional
        Codec string of every array (``"zstd:3"``, ``"blosc:lz4:5:shuffle"``, ``"none"``);
        default the atomic writer's (``"blosc:lz4:5:shuffle"``).
    num_threads : int, default 2
        1: read, build neighbour lists and write on the calling thread, one after the other.
        2 or more: the store is written (compressed) on a second thread while the calling
        thread reads the next structures, with num_threads - 1 compression threads per array.
    progress : callable, optional
        ``progress(done)`` with the number of structures converted so far, after each batch
        and once at the end.

    The first structure fixes the fields (see the module documentation for what each
    structure becomes): a later structure without one of them is an error; a field only later
    structures carry is dropped with a warning. Nothing is left at ``output`` when the
    conversion fails.

    Raises ``ValueError`` for a cutoff that is not a finite number > 0, a file ASE cannot read
    (naming it and the structure), a structure without atoms or with a position that is not
    finite, a singular periodic cell, inconsistent fields, or no structures at all;
    ``FileNotFoundError`` for a missing input; ``FileExistsError`` when ``output`` exists.

    Example::

        >>> n = zbatch.convert_ase("md.traj", "md.zarr", cutoff=5.0, index="::10",
        ...                        codec="zstd:3", progress=lambda k: print(k, "done"))
    """
    cutoff = _check_cutoff(cutoff)
    paths, out, batch_size = _check_job(
        inputs, output, zarr_format, batch_size, "input files",
        lambda p: "://" in str(p) or os.path.exists(p), "no such file")
    created = not os.path.exists(out)

    schema = _Schema()
    skipped: set[str] = set()
    done = 0

    def samples() -> Iterator[dict[str, np.ndarray]]:
        nonlocal done
        for path in paths:
            for k, atoms in _read(path, index, format):
                if progress is not None and done and done % batch_size == 0:
                    progress(done)
                where = f"{path}: structure {k}"
                sample = schema.apply(_structure(atoms, cutoff, where, skipped), where)
                del atoms
                done += 1
                yield sample

    num_threads = max(1, int(num_threads))
    it = samples()
    try:
        first = next(it, None)  # the first structure fixes the fields (and their levels)
        if first is None:
            raise ValueError(f"no structures in {', '.join(paths)} (index {index!r})")
        config = _atomic.WriteConfig(
            meta=_atomic.ArrayConfig(codec=codec), core=_atomic.ArrayConfig(codec=codec),
            custom=_atomic.ArrayConfig(codec=codec), num_threads=max(1, num_threads - 1))
        levels = {k: v for k, v in schema.levels().items() if k not in _atomic._CORE_LEVELS}
        writer = _atomic.AtomicWriter(out, config, levels=levels, block_size=batch_size)
        if num_threads == 1:
            writer.write(_chain_first(first, it))
        else:
            _write_behind(writer, _chain_first(first, it), batch_size)
    except BaseException:
        _remove(out, created)
        raise
    if progress is not None:
        progress(done)
    return done


def _remove(out: str, created: bool) -> None:
    """Removes what a failed conversion wrote: the store directory if this call made it, else
    its contents (it was empty)."""
    if created:
        shutil.rmtree(out, ignore_errors=True)
    elif os.path.isdir(out):
        for entry in os.listdir(out):
            p = os.path.join(out, entry)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.remove(p)


class _Abort(Exception):
    """Handed to the writing thread when reading failed: the store must not be committed."""


def _write_behind(writer: Any, samples: Iterator[Any], batch_size: int) -> None:
    """Runs writer.write on a second thread, fed through a bounded queue, while this thread
    reads (ASE's parsing holds the GIL; compression in libzbatch releases it, so the two
    overlap). At most batch_size samples wait in the queue besides the batch the writer holds.
    Whatever fails on either side stops both, and the store is left uncommitted."""
    q: queue.Queue = queue.Queue(maxsize=batch_size)
    end = object()
    failed: list[BaseException] = []

    def drain() -> Iterator[Any]:
        while True:
            item = q.get()
            if item is end:
                return
            if isinstance(item, _Abort):
                raise item
            yield item

    def work() -> None:
        try:
            writer.write(drain())
        except _Abort:
            pass
        except BaseException as e:
            failed.append(e)
            while True:  # unblock the reading thread: it sees `failed` at its next put
                try:
                    q.get_nowait()
                except queue.Empty:
                    break

    def put(item: Any) -> None:
        while True:
            if failed:
                raise failed[0]
            try:
                q.put(item, timeout=0.05)
                return
            except queue.Full:
                if not thread.is_alive():
                    raise RuntimeError("the writing thread stopped") from None

    thread = threading.Thread(target=work, name="zbatch-convert-ase-writer", daemon=True)
    thread.start()
    try:
        for sample in samples:
            put(sample)
        put(end)
    except BaseException:
        while thread.is_alive():  # make the writer stop without committing
            try:
                q.put(_Abort(), timeout=0.05)
                break
            except queue.Full:
                try:
                    q.get_nowait()
                except queue.Empty:
                    pass
        thread.join()
        raise
    thread.join()
    if failed:
        raise failed[0]


def _chain_first(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest
