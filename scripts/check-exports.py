"""Fails unless libzbatch.so exports exactly what the public headers declare (a CTest test).

    python3 scripts/check-exports.py build/libzbatch.so

Reads `nm -D --defined-only` of the library and the declarations of include/*.h (through
scripts/public_api.py) and names every symbol exported without a declaration, every declaration
the library does not export, and every declaration written without ZB_API.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import public_api  # noqa: E402

# What the linker itself defines in every shared object.
LINKER = {"_init", "_fini", "_edata", "_end", "__bss_start"}


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True,
                         text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()} - LINKER


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    have = exported(sys.argv[1])
    want = public_api.exported_names()
    problems = []
    for h in public_api.public_headers():
        for name in public_api.declarations(h)[2]:
            problems.append(f"{os.path.basename(h)}: {name} is declared without ZB_API")
    problems += [f"exported but in no public header: {n}" for n in sorted(have - want)]
    problems += [f"declared in a public header but not exported: {n}" for n in sorted(want - have)]
    for p in problems:
        print(p)
    if problems:
        sys.exit(f"{sys.argv[1]}: {len(problems)} problems with the exported symbols")
    print(f"{sys.argv[1]}: exports exactly the {len(want)} functions the public headers declare")


if __name__ == "__main__":
    main()
