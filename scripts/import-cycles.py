#!/usr/bin/env python3
"""Finds import circles: files that need each other, directly or around a loop.

    scripts/import-cycles.py            (from anywhere in the repository)

One graph per crate, each must be acyclic (exit 1 and the circles printed
otherwise):

- the Rust modules of every crate of the workspace (each member named in the
  top Cargo.toml, and fuzz/): an edge A -> B when A's code (not its comments,
  not its #[cfg(test)] tests) names B by a `crate::`, `super::` or `self::`
  path. A module and its own submodules are one unit (a parent declares its
  children; a child using its parent's items is not a circle). A crate's
  binaries (src/main.rs, src/bin/) are thin roots over its library and are
  not part of its module graph.
- the shim's C files (shim/c): an edge a.c -> b.c when a.c calls an ml_*
  function that b.c defines.

What is counted is what a reader follows: which file's code you must read to
understand this one. Issue 19 asked for none of these circles in the daemon
and the shim; issue 26 for none anywhere.
"""
import os
import re
import subprocess
import sys


def strip_rust(src):
    src = re.split(r"#\[cfg\(test\)\]\s*mod tests", src)[0]
    return "\n".join(line for line in src.splitlines() if not line.lstrip().startswith("//"))


def rust_graph(root):
    mods = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs") or dirpath.endswith("/bin"):
                continue
            if dirpath == root and name == "main.rs":
                continue
            path = os.path.join(dirpath, name)
            parts = os.path.relpath(path, root)[:-3].split("/")
            if parts[-1] in ("mod", "lib"):
                parts = parts[:-1]
            mods["::".join(parts)] = path

    def resolve(current, path):
        segs = path.split("::")
        if segs[0] == "crate":
            base, segs = [], segs[1:]
        elif segs[0] == "super":
            base = current.split("::") if current else []
            while segs and segs[0] == "super":
                segs, base = segs[1:], base[:-1]
        else:  # self
            base, segs = (current.split("::") if current else []), segs[1:]
        full = base + segs
        for n in range(len(full), 0, -1):
            key = "::".join(full[:n])
            if key in mods:
                return key
        return None

    edges = {}
    for module, path in mods.items():
        with open(path) as f:
            code = strip_rust(f.read())
        for used in re.findall(r"\b(?:crate|super|self)(?:::\w+)+", code):
            target = resolve(module, used)
            if not target or target == module:
                continue
            if target.startswith(module + "::") or module.startswith(target + "::"):
                continue
            edges.setdefault(module, set()).add(target)
    return edges


def c_graph(root):
    files = sorted(f for f in os.listdir(root) if f.endswith(".c"))
    defined = {}
    sources = {}
    for name in files:
        with open(os.path.join(root, name)) as f:
            sources[name] = f.read()
        for m in re.finditer(r"^[A-Za-z_][\w \*]*?\b(ml_\w+)\s*\([^;{]*\)\s*\{", sources[name], re.M):
            defined[m.group(1)] = name
    edges = {}
    for name, src in sources.items():
        code = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
        for fn in set(re.findall(r"\b(ml_\w+)\s*\(", code)):
            target = defined.get(fn)
            if target and target != name:
                edges.setdefault(name, set()).add(target)
    return edges


def cycles(edges):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
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
                out.append(sorted(comp))

    nodes = set(edges) | {w for ws in edges.values() for w in ws}
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def crate_dirs(top):
    """Every crate's source directory: the workspace members, then fuzz/."""
    with open(os.path.join(top, "Cargo.toml")) as f:
        manifest = f.read()
    members = re.search(r"^members\s*=\s*\[([^\]]*)\]", manifest, re.M)
    if not members:
        sys.exit("import-cycles: no `members = [...]` in Cargo.toml")
    names = re.findall(r'"([^"]+)"', members.group(1)) + ["fuzz"]
    dirs = []
    for name in names:
        src = os.path.join(name, "src")
        if not os.path.isdir(os.path.join(top, src)) and name == "fuzz":
            src = os.path.join(name, "fuzz_targets")
        if not os.path.isdir(os.path.join(top, src)):
            sys.exit(f"import-cycles: crate {name} has no {src}/")
        dirs.append(src)
    return dirs


def main():
    top = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
    failed = False
    graphs = [(f"{src} (Rust modules)", rust_graph(os.path.join(top, src))) for src in crate_dirs(top)]
    graphs.append(("shim/c (C files)", c_graph(os.path.join(top, "shim/c"))))
    for label, edges in graphs:
        found = cycles(edges)
        if found:
            failed = True
            for comp in found:
                print(f"import-cycles: {label}: circle through {', '.join(comp)}")
        else:
            count = sum(len(v) for v in edges.values())
            print(f"import-cycles: {label}: no circles ({count} edges)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
