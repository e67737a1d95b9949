"""The zbatch command for a pip user: `python -m zbatch ...` and the `zbatch` entry point.

Both run the C command (cli/), which a wheel carries inside the package as zbatch/bin/zbatch with
the libraries it needs; a checkout uses the one its build made (build/zbatch). The jobs that need
Python run here instead: `convert --from ase|lmdb` (structures ASE reads, fairchem-style LMDBs),
`convert --scheduler ADDRESS` (AnnData inputs converted on a Dask cluster) and `repair` (atomic
stores nvalchemi's writer damaged). The C command hands exactly those to `python -m zbatch ...`
(cli/convert.c, cli/main.c), so the rule here takes at least what it hands over and neither side
hands the job back to the other.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional


def _convert_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zbatch convert", description=__doc__)
    p.add_argument("inputs", nargs="+")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--from", dest="source", choices=["anndata", "ase", "lmdb"], default="anndata")
    p.add_argument("--scheduler", help="address of a Dask scheduler (tcp://host:8786)")
    p.add_argument("--dataset-size", type=int)
    p.add_argument("--var-join", choices=["outer", "inner"], default="outer")
    p.add_argument("--genes")
    p.add_argument("--obs", help="comma-separated obs columns ('' for none)")
    p.add_argument("--x", default="X")
    p.add_argument("--layers", default="")
    p.add_argument("--memory", default="4G")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--format", choices=["v2", "v3", "2", "3"], default="v3")
    p.add_argument("--codec")
    p.add_argument("--chunk", type=int)
    p.add_argument("--shard", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--data-dtype", choices=["auto", "keep", "uint8", "uint16", "float32"],
                   default="auto")
    p.add_argument("--index-dtype", choices=["auto", "narrow", "int32"], default="auto")
    p.add_argument("--quiet", "-q", action="store_true")
    p.add_argument("--cutoff", type=float, help="--from ase: neighbour-list cutoff (Angstrom); "
                   "--from lmdb: for entries without edge_index")
    p.add_argument("--index", default=":", help="--from ase: which structures of each file")
    return p


def _convert(argv: list) -> int:
    args = _convert_parser().parse_args(argv)
    fmt = 2 if args.format in ("v2", "2") else 3
    if args.source == "ase":
        from ._ase import convert_ase
        if args.cutoff is None:
            print("zbatch convert: --from ase needs --cutoff R", file=sys.stderr)
            return 2
        n = convert_ase(args.inputs, args.output, cutoff=args.cutoff, index=args.index,
                        zarr_format=fmt, codec=args.codec)
        print(f"converted {n} structures into {args.output}")
        return 0
    if args.source == "lmdb":
        from ._lmdb import convert_lmdb
        n = convert_lmdb(args.inputs, args.output, cutoff=args.cutoff, zarr_format=fmt,
                         codec=args.codec, chunk_rows=args.chunk, shard_rows=args.shard,
                         num_threads=2 if args.threads is None else args.threads)
        print(f"converted {n} entries into {args.output}")
        return 0
    from ._convert import convert
    client = None
    if args.scheduler:
        from dask.distributed import Client
        client = Client(args.scheduler)
    try:
        manifest = convert(args.inputs, args.output, dataset_size=args.dataset_size,
                var_join=args.var_join, genes=args.genes,
                obs=None if args.obs is None else [c for c in args.obs.split(",") if c],
                x=args.x, layers=[c for c in args.layers.split(",") if c], memory=args.memory,
                seed=args.seed, shuffle=not args.no_shuffle, zarr_format=fmt, codec=args.codec,
                chunk=args.chunk, shard=args.shard, num_threads=args.threads,
                data_dtype=None if args.data_dtype == "auto" else args.data_dtype,
                narrow_indices={"auto": None, "narrow": True, "int32": False}[args.index_dtype],
                progress=not args.quiet, client=client)
        print(f"converted {len(args.inputs)} input{'s' if len(args.inputs) != 1 else ''} into "
              f"{args.output}")
        dtypes = manifest.get("dtypes") or {}
        print("stored " + ", ".join(f"{k} {v}" for k, v in dtypes.items()))
    finally:
        if client is not None:
            client.close()
    return 0


def _repair(argv: list) -> int:
    p = argparse.ArgumentParser(
        prog="zbatch repair",
        description="Writes a corrected copy of an nvalchemi AtomicData store whose edge "
                    "indices nvalchemi-toolkit's append or defragment damaged (negative, or past "
                    "the sample), beside the damaged store, which is only read. Each sample's "
                    "indices are re-based by the one offset that puts them inside the sample "
                    "(its edges must reach its first and last atom); a sample where no single "
                    "offset or several fit is refused, naming it. Soft-deleted samples are "
                    "left out.")
    p.add_argument("store")
    p.add_argument("-o", "--output", help="the corrected store (default NAME.repaired.zarr "
                   "beside NAME.zarr)")
    p.add_argument("--codec", help="codec of every array (default the atomic writer's)")
    args = p.parse_args(argv)
    from ._repair import repair
    r = repair(args.store, args.output, codec=args.codec)
    print(f"repaired {args.store} into {r['output']}: {r['samples']} samples, "
          f"{r['rebased']} with re-based edge indices, {r['dropped']} deleted left out")
    return 0


# The options cli/convert.c hands to Python (it matches the exact words); argparse also takes
# them as --from=ase and --scheduler=ADDRESS.
_PYTHON_CONVERT_OPTIONS = ("--from", "--scheduler")


def _runs_in_python(argv: list) -> bool:
    return argv[:1] == ["repair"] or (
        argv[:1] == ["convert"] and any(a.split("=", 1)[0] in _PYTHON_CONVERT_OPTIONS
                                        for a in argv[1:]))


def command_path() -> Optional[str]:
    """The C command this package runs: zbatch/bin/zbatch (a wheel, or a checkout after
    scripts/dev-install.py), else a checkout's build/zbatch; None when neither exists."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "bin", "zbatch")]
    checkout = os.path.dirname(os.path.dirname(here))
    if os.path.basename(os.path.dirname(here)) == "python" and \
            os.path.isfile(os.path.join(checkout, "CMakeLists.txt")):
        candidates.append(os.path.join(checkout, "build", "zbatch"))
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def _exec_command(argv: list) -> int:
    path = command_path()
    if path is None:
        print("zbatch: this installation has no zbatch command (zbatch/bin/zbatch); install the "
              "wheel, or build the checkout (make)", file=sys.stderr)
        return 2
    # The command hands `convert --from` / `--scheduler` and `repair` back to a Python: this one,
    # which has this package (the user's own ZBATCH_PYTHON wins).
    env = dict(os.environ)
    env.setdefault("ZBATCH_PYTHON", sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(path, [path, *argv], env)
    return 1  # not reached: execve replaces this process or raises OSError


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not _runs_in_python(argv):
        return _exec_command(argv)
    jobs = {"convert": _convert, "repair": _repair}
    from ._zbatch import ZbatchError
    try:
        return jobs[argv[0]](argv[1:])
    except (ZbatchError, ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"zbatch {argv[0]}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
