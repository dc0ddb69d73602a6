#!/usr/bin/env python3
"""Checks the source layout rules of ARCHITECTURE.md that rustc and clippy do not.

For every Rust source file of the workspace (and fuzz/):
  * it opens with a `//!` module doc (inner attributes `#![...]` may come first);
  * it has at most MAX_LINES lines;
  * it carries no `too_many_arguments` allow (use a parameter struct);
and within each crate there are no import circles: a file that names another
module of its crate (`use crate::x`, `crate::x::y`, `super::z`, `self::w`)
depends on it, and no set of files may depend on each other in a ring. A
module declaring or re-exporting its own children is structure, not an
import, so edges from a module to its descendants are not counted; code under
a trailing `#[cfg(test)]` is left out (tests may reach anywhere).

Usage: scripts/check-layout.py [DIR...]   (default: the whole workspace)
Exit status 1 with one line per problem, 0 when the rules hold.
"""

import os
import re
import sys

MAX_LINES = 800
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {"target", ".git", "corpus", "artifacts", "node_modules"}

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def rust_files(dirs):
    for d in dirs:
        for base, subdirs, files in os.walk(d):
            subdirs[:] = sorted(s for s in subdirs if s not in SKIP_DIRS)
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(base, f)


def crate_src_root(path):
    """(crate source dir, module path) of a file below some `src/` dir, else None."""
    parts = path.split(os.sep)
    if "src" not in parts:
        return None
    i = len(parts) - 1 - parts[::-1].index("src")
    src = os.sep.join(parts[: i + 1])
    rel = parts[i + 1 :]
    if rel[0] == "bin":
        return None  # each binary is its own crate root; no module graph
    stem = rel[-1][:-3]
    mods = rel[:-1]
    if stem not in ("lib", "main", "mod"):
        mods = mods + [stem]
    elif stem in ("lib", "main") and mods:
        mods = mods + [stem]
    return src, tuple(mods)


def strip_comments_and_strings(text):
    """The code with comments, string and char literals blanked (lines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == "/" and nxt == "*":
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
            out.append(" ")
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 260]) if c in "br" else None
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = '"' + m.group(1)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
            continue
        if c == "'":
            m = re.match(r"'(\\[^']{1,10}|[^'\\])'", text[i:i + 14])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def without_trailing_tests(text):
    m = re.search(r"^#\[cfg\(test\)\]\s*\n\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text, flags=re.M)
    return text[: m.start()] if m else text


def expand_use_tree(prefix, body):
    """Paths named by `prefix::{body}` (one level of nesting handled recursively)."""
    out = []
    depth = 0
    cur = ""
    for ch in body + ",":
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            item = cur.strip()
            cur = ""
            if not item:
                continue
            m = re.match(r"^((?:%s::)*)\{(.*)\}$" % IDENT, item, flags=re.S)
            if m:
                out += expand_use_tree(prefix + [s for s in m.group(1).split("::") if s], m.group(2))
            else:
                segs = [s for s in re.split(r"::", item.split(" as ")[0].strip()) if s]
                out.append(prefix + segs)
            continue
        cur += ch
    return out


def referenced_paths(text):
    """Module-relative paths named in the code: ('crate'|'super'|'self', [segments])."""
    refs = []
    for m in re.finditer(r"\b(crate|super|self)((?:::%s)*)::\{" % IDENT, text):
        start = m.end()
        depth, j = 1, start
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        head = [s for s in m.group(2).split("::") if s]
        for p in expand_use_tree(head, text[start : j - 1]):
            refs.append((m.group(1), p))
    for m in re.finditer(r"\b(crate|super|self)((?:::%s)+)" % IDENT, text):
        refs.append((m.group(1), [s for s in m.group(2).split("::") if s]))
    return refs


def main():
    dirs = sys.argv[1:] or [ROOT]
    problems = []
    files = list(rust_files(dirs))
    # crate src dir -> {module path -> file}
    modules = {}
    for f in files:
        cr = crate_src_root(f)
        if cr:
            modules.setdefault(cr[0], {})[cr[1]] = f
    edges = {}
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            raw = fh.read()
        rel = os.path.relpath(f, ROOT)
        lines = raw.count("\n") + (0 if raw.endswith("\n") else 1)
        if lines > MAX_LINES:
            problems.append(f"{rel}: {lines} lines (at most {MAX_LINES}: split it by concept)")
        first = next((l for l in raw.splitlines() if l.strip() and not l.startswith("#![")), "")
        if not first.startswith("//!"):
            problems.append(f"{rel}: does not open with a `//!` module doc")
        code = strip_comments_and_strings(raw)
        if "too_many_arguments" in code:
            problems.append(f"{rel}: allows clippy::too_many_arguments (use a parameter struct)")
        cr = crate_src_root(f)
        if not cr:
            continue
        src, me = cr
        mods = modules[src]
        for kind, segs in referenced_paths(without_trailing_tests(code)):
            if kind == "crate":
                base = []
            elif kind == "self":
                base = list(me)
            else:
                n = 0
                while segs and segs[0] == "super":
                    segs = segs[1:]
                    n += 1
                base = list(me)[: max(0, len(me) - 1 - n)]
            path = base + segs
            # the longest prefix that is a module file of this crate
            target = None
            for k in range(len(path), -1, -1):
                if tuple(path[:k]) in mods:
                    target = tuple(path[:k])
                    break
            if target is None or target == me:
                continue
            if target[: len(me)] == me:
                continue  # a module reaching into its own children: structure
            edges.setdefault((src, me), set()).add(target)
    # strongly connected components per crate (Tarjan)
    for src, mods in sorted(modules.items()):
        graph = {m: sorted(edges.get((src, m), ())) for m in mods}
        index, low, on, stack, out = {}, {}, set(), [], []
        counter = [0]

        def strong(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in graph.get(v, ()):
                if w not in index:
                    strong(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)

        sys.setrecursionlimit(10000)
        for v in sorted(graph):
            if v not in index:
                strong(v)
        for comp in out:
            names = sorted("::".join(m) or "(crate root)" for m in comp)
            problems.append(
                f"{os.path.relpath(src, ROOT)}: import circle between modules {{{', '.join(names)}}}"
            )
    for p in problems:
        print(f"check-layout: {p}")
    if problems:
        print(f"check-layout: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check-layout: layout rules hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
