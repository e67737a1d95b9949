"""The public API as the headers in include/ declare it: the one source both
scripts/check-exports.py (what libzbatch.so may export) and scripts/internal-names.py (which
zb_ names are internal) read.

A header is read as text, not compiled: comments and preprocessor lines are dropped, then the
top-level statements (split at ';' outside braces and parentheses) are sorted into function
declarations and the rest. Every function declaration carries the export macro ZB_API; a
declaration without it is reported, so a new function cannot be forgotten.
"""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
ZB_NAME = re.compile(r"\bzb_\w+\b")


def public_headers(root=ROOT):
    return sorted(glob.glob(os.path.join(root, "include", "*.h")))


def strip_comments(text):
    """Drops /* */ and // comments, keeping string literals and line breaks."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_preprocessor(text):
    """Drops preprocessor lines (with their continuations) and the C++ linkage braces."""
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", text, flags=re.M)
    return re.sub(r'extern\s+"C"\s*\{', "", text)


def statements(text):
    """Top-level statements: split at ';' where no brace or parenthesis is open. A stray '}'
    at depth 0 (the end of an extern "C" block) is dropped."""
    out, cur, depth = [], [], 0
    for c in text:
        if c in "({[":
            depth += 1
        elif c in ")}]":
            if depth == 0:
                continue
            depth -= 1
        if c == ";" and depth == 0:
            out.append(" ".join("".join(cur).split()))
            cur = []
        else:
            cur.append(c)
    return [s for s in out if s]


def _top_level_paren(stmt):
    """Index of the first '(' at depth 0, or -1."""
    depth = 0
    for i, c in enumerate(stmt):
        if c == "(" and depth == 0:
            return i
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
    return -1


def declarations(path):
    """(functions, variables, unmarked): the functions and global variables `path` declares, and
    those of them written without ZB_API."""
    with open(path, encoding="utf-8") as f:
        text = strip_preprocessor(strip_comments(f.read()))
    functions, variables, unmarked = [], [], []
    for stmt in statements(text):
        if stmt.startswith("typedef") or re.match(r"(struct|enum|union)\s+\w*\s*\{", stmt):
            continue
        paren = _top_level_paren(stmt)
        head = stmt[:paren] if paren >= 0 else stmt.split("=")[0]
        names = IDENT.findall(head)
        if not names:
            continue
        name = names[-1]
        (functions if paren >= 0 else variables).append(name)
        if "ZB_API" not in names:
            unmarked.append(name)
    return functions, variables, unmarked


def exported_names(root=ROOT):
    """Every function and global the public headers declare: what libzbatch.so exports."""
    names = set()
    for h in public_headers(root):
        functions, variables, _ = declarations(h)
        names.update(functions, variables)
    return names


def public_names(root=ROOT):
    """Every zb_ identifier the public headers name outside comments: functions, types, struct
    tags, members and enumerators. The rest of the zb_ names in the tree are internal."""
    names = set()
    for h in public_headers(root):
        with open(h, encoding="utf-8") as f:
            names.update(ZB_NAME.findall(strip_comments(f.read())))
    return names
