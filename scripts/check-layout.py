#!/usr/bin/env python3
"""Checks the source layout rules of ARCHITECTURE.md that rustc and clippy do not.

For every Rust source file of the workspace (and fuzz/):
  * it opens with a `//!` module doc (inner attributes `#![...]` may come first);
  * it has at most MAX_LINES lines;
  * it carries no `too_many_arguments` allow (use a parameter struct);
and within each crate there are no import circles: a file that names another
module of its crate (`use crate::x`, `crate::x::y`, `super::z`, `self::w`)
depends on it, and no set of files may depend on each other in a ring.
  * A name reached through a `use` item of another module (a re-export such
    as `pub use b::B;` in lib.rs, then `crate::B`) is an import of the file
    that defines it, not of the module that re-exports it.
  * A glob import (`use super::*;`, `crate::x::*`) imports that module.
  * A module's `mod` and `use` items naming its own descendants are
    structure, not imports; its other code naming a descendant
    (`child::f()`, `self::child::T`) is an import like any other, so a
    `mod.rs` holding types its children use must not use them back.
Code under a trailing `#[cfg(test)]` is left out (tests may reach anywhere).

Usage: scripts/check-layout.py [DIR...]   (default: the whole workspace)
       scripts/check-layout.py --self-test (the circle rules on small crates)
Exit status 1 with one line per problem, 0 when the rules hold.
"""

import os
import re
import sys

MAX_LINES = 800
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {"target", ".git", "corpus", "artifacts", "node_modules"}

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
USE_ITEM = r"(?<![A-Za-z0-9_])use\s+([^;]+);"


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
    # glob imports name the module itself: `use super::*;`, `crate::a::*`
    for m in re.finditer(r"\b(crate|super|self)((?:::%s)*)::\*" % IDENT, text):
        refs.append((m.group(1), [s for s in m.group(2).split("::") if s]))
    return refs


def imported_names(text, children):
    """The names a module's `use` items bring in (`pub` or not: a private
    `use` at the crate root is visible to every module below it), as
    name -> ('crate'|'super'|'self', [segments of the item]). Glob imports
    bring no name."""
    names = {}
    for m in re.finditer(USE_ITEM, text):
        for segs, alias in use_tree_items(m.group(1)):
            segs = [s for s in segs if s]
            if not segs or segs[-1] == "*":
                continue
            if segs[-1] == "self":
                segs = segs[:-1]
            if not segs:
                continue
            if segs[0] in ("crate", "super", "self"):
                kind, rest = segs[0], segs[1:]
            elif segs[0] in children:
                kind, rest = "self", segs  # a 2018 uniform path: a child module
            else:
                continue  # another crate
            if rest:
                names[alias or rest[-1]] = (kind, rest)
    return names


def use_tree_items(tree):
    """(segments, alias) of every leaf of a use tree `a::{b as c, d::*}`."""
    tree = tree.strip()
    m = re.match(r"^((?:%s::)*)\{(.*)\}$" % IDENT, tree, flags=re.S)
    if not m:
        parts = re.split(r"\s+as\s+", tree)
        alias = parts[1].strip() if len(parts) > 1 else None
        return [([s.strip() for s in parts[0].split("::")], alias)]
    head = [s for s in m.group(1).split("::") if s]
    out, depth, cur = [], 0, ""
    for ch in m.group(2) + ",":
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            if cur.strip():
                out += [(head + segs, alias) for segs, alias in use_tree_items(cur)]
            cur = ""
            continue
        cur += ch
    return out


# Small crates for --self-test: {file: text}, and whether a circle is expected.
SELF_TEST = [
    ("sibling circle", True, {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "use crate::b::B;\npub struct A;\n",
        "b.rs": "use crate::a::A;\npub struct B;\n"}),
    ("three-file ring through use trees and super", True, {
        "lib.rs": "mod a;\nmod b;\nmod c;\n",
        "a.rs": "use crate::{b::B, x};\npub struct A;\n",
        "b.rs": "use super::c::C;\npub struct B;\n",
        "c.rs": "pub struct C;\nfn f(_: crate::a::A) {}\n"}),
    ("circle through a re-export at the root", True, {
        "lib.rs": "mod a;\nmod b;\npub use b::B;\n",
        "a.rs": "use crate::B;\npub struct A;\n",
        "b.rs": "use crate::a::A;\npub struct B;\n"}),
    ("glob import of a parent that uses the child", True, {
        "lib.rs": "mod a;\npub struct R;\nfn f() { a::g(); }\n",
        "a.rs": "use super::*;\npub fn g() {}\n"}),
    ("mod.rs whose code uses a child that uses it", True, {
        "lib.rs": "mod p;\n",
        "p/mod.rs": "mod c;\npub fn helper() {}\npub fn run() { c::work() }\n",
        "p/c.rs": "pub fn work() { super::helper() }\n"}),
    ("re-exports and children using their parent: no circle", False, {
        "lib.rs": "mod a;\nmod b;\npub use a::A;\npub use b::B;\npub struct R;\n",
        "a.rs": "use crate::R;\npub struct A;\n",
        "b.rs": "use crate::A;\npub struct B;\n"}),
]


def self_test():
    import tempfile
    failed = 0
    for name, circle, files in SELF_TEST:
        with tempfile.TemporaryDirectory() as d:
            for rel, text in files.items():
                path = os.path.join(d, "src", rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as fh:
                    fh.write("//! " + rel + "\n" + text)
            problems = check([d])
        found = any("import circle" in p for p in problems)
        ok = found == circle and all("import circle" in p for p in problems)
        print(f"check-layout self-test: {'ok' if ok else 'FAILED'}: {name}: {problems or 'no problem'}")
        failed += not ok
    return 1 if failed else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    problems = check(sys.argv[1:] or [ROOT])
    for p in problems:
        print(f"check-layout: {p}")
    if problems:
        print(f"check-layout: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check-layout: layout rules hold")
    return 0


def check(dirs):
    """The problems of the Rust files under `dirs`, one line each."""
    problems = []
    files = list(rust_files(dirs))
    # crate src dir -> {module path -> file}
    modules = {}
    for f in files:
        cr = crate_src_root(f)
        if cr:
            modules.setdefault(cr[0], {})[cr[1]] = f
    codes = {}
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
        codes[f] = without_trailing_tests(code)
    def children_of(src, me):
        return [m for m in modules[src] if len(m) == len(me) + 1 and m[: len(me)] == me]

    # crate src dir -> {module path -> {imported name -> (kind, segments)}}
    imports = {}
    for src, mods in modules.items():
        for me, f in mods.items():
            children = {c[-1] for c in children_of(src, me)}
            imports.setdefault(src, {})[me] = imported_names(codes[f], children)

    def resolve(src, me, kind, segs, depth=0):
        """The module file of crate `src` that `kind::segs`, named in module
        `me`, lives in: the longest prefix that is a module, followed through
        the `use` items of that module when the next segment is a name it
        imports (a re-export is not where the item lives)."""
        mods = modules[src]
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
        for k in range(len(path), -1, -1):
            target = tuple(path[:k])
            if target in mods:
                break
        else:
            return None
        if k < len(path) and depth < 20:
            imported = imports[src].get(target, {}).get(path[k])
            if imported:
                ikind, isegs = imported
                via = resolve(src, target, ikind, list(isegs) + path[k + 1 :], depth + 1)
                if via is not None:
                    return via
        return target

    edges = {}
    for f in files:
        cr = crate_src_root(f)
        if not cr:
            continue
        src, me = cr
        # the code outside `use` items: what names a descendant there uses it
        body = re.sub(USE_ITEM, lambda m: "\n" * m.group(0).count("\n"), codes[f])
        used_below = {resolve(src, me, k, s) for k, s in referenced_paths(body)}
        for child in children_of(src, me):
            # a 2018 path starting at a child module: `child::f()`
            if re.search(r"(?<![A-Za-z0-9_:])%s::" % child[-1], body):
                used_below.add(child)
                edges.setdefault((src, me), set()).add(child)
        for kind, segs in referenced_paths(codes[f]):
            target = resolve(src, me, kind, segs)
            if target is None or target == me:
                continue
            if target[: len(me)] == me and target not in used_below:
                continue  # declaring or re-exporting its own children: structure
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
    return problems


if __name__ == "__main__":
    sys.exit(main())
