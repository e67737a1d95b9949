"""Renames every internal zb_ name to zb__ (libuv's uv__ habit), so that a reader tells the
API from the internals at a glance.

    python3 scripts/internal-names.py [--exclude PATH]... [--dry-run]

Public names are the zb_ identifiers the headers in include/ name (scripts/public_api.py):
functions, types, struct tags, members, enumerators. Every other identifier that starts with
zb_ (one underscore) in the C sources (src/, cli/, bench/, python/zbatch/*.[ch], tests/**) and
the docs (docs/*.md, README.md) is internal and becomes zb__NAME; RENAMES below renames a few
internal names further, where the old name said the wrong thing. Matching is by whole words
(identifiers), in code, comments and strings alike, so messages and comments keep naming
the function they mean.

Idempotent: a second run changes nothing. --exclude PATH leaves a file alone (one that another
branch is rewriting) and, so that the tree still builds, every name that file uses: run the
script again without it once that branch is merged.
"""
import argparse
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import public_api  # noqa: E402

ROOT = public_api.ROOT
CODE = ["src/**/*.[ch]", "cli/*.[ch]", "bench/*.[ch]", "python/zbatch/*.[ch]", "tests/**/*.[ch]"]
DOCS = ["docs/*.md", "README.md"]
# zb_ followed by a word character that is not '_': a name not yet renamed (a prefix named in a
# comment, "zb_codec_*", ends with '_' and is no name).
INTERNAL = re.compile(r"\bzb_(?!_)\w*[A-Za-z0-9]\b")
# A name a macro pastes together (zb_##name##_decode): renamed with the names it makes.
PASTE = re.compile(r"\bzb_##[\w#]*")

# Internal names that change more than their prefix. "atomic" names the nvalchemi layout in
# the public API only; inside the library the layout is "atomistic" (src/write/atomistic*.c),
# so "atomic" is never read as a crash-safe write or an atomic integer.
RENAMES = {
    "zb_atomic_array_level": "zb__atomistic_array_level",
    "zb_atomic_check_fields_attr": "zb__atomistic_check_fields_attr",
    "zb_atomic_check_required": "zb__atomistic_check_required",
    "zb_layout_atomic": "zb__layout_atomistic",
    "zb_layout_atomistic": "zb__layout_atomistic",
}


def files(patterns):
    out = set()
    for p in patterns:
        out.update(os.path.relpath(f, ROOT) for f in glob.glob(os.path.join(ROOT, p),
                                                                recursive=True))
    return sorted(f for f in out if not f.startswith(("build", ".venv")))


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exclude", action="append", default=[], metavar="PATH",
                    help="a file left alone, with every name it uses (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="print what would change")
    args = ap.parse_args()

    public = public_api.public_names()
    clash = sorted(n for n in RENAMES if n in public)
    if clash:
        sys.exit(f"internal-names: RENAMES holds public names: {', '.join(clash)}")
    code, docs = files(CODE), files(DOCS)
    excluded = {os.path.normpath(p) for p in args.exclude}
    missing = sorted(p for p in excluded if not os.path.exists(os.path.join(ROOT, p)))
    if missing:
        sys.exit(f"internal-names: no such file to exclude: {', '.join(missing)}")

    names, pastes = set(), set()
    for f in code:
        text = read(f)
        names.update(INTERNAL.findall(text))
        pastes.update(PASTE.findall(text))
    names -= public
    held = set()
    for f in excluded:
        held.update(n for n in INTERNAL.findall(read(f)) if n in names)
    # the names each pasting macro makes move together: all renamed, or (one of them used by an
    # excluded file, or public) none
    for paste in sorted(pastes):
        made = re.compile(re.sub(r"##\w+(##)?", "[A-Za-z0-9]+", paste) + r"$")
        group = {n for n in names | public if made.match(n)}
        if group & (held | public):
            held |= group - public
            pastes.discard(paste)
        if args.dry_run:
            print(f"{paste} makes {' '.join(sorted(group))}"
                  + (" (left as it is)" if paste not in pastes else ""))
    renames = {n: RENAMES.get(n, "zb__" + n[3:]) for n in names - held}
    renames.update({p: "zb__" + p[3:] for p in pastes})
    if not renames:
        print("internal-names: nothing to rename")
        return
    words = sorted(map(re.escape, renames), key=len, reverse=True)
    pattern = re.compile(r"\b(" + "|".join(words) + r")(?![\w#])")
    changed = 0
    for f in code + docs:
        if f in excluded:
            continue
        text = read(f)
        new = pattern.sub(lambda m: renames[m.group(1)], text)
        if new != text:
            changed += 1
            if args.dry_run:
                print(f"{f}: {len(pattern.findall(text))} renames")
            else:
                with open(os.path.join(ROOT, f), "w", encoding="utf-8") as out:
                    out.write(new)
    verb = "would rename" if args.dry_run else "renamed"
    print(f"internal-names: {verb} {len(renames)} names in {changed} files"
          + (f"; {len(held)} names left as they are because excluded files use them"
             if held else ""))


if __name__ == "__main__":
    main()
