#!/usr/bin/env python3
"""Writes TAPI v4 .tbd link stubs for the Apple frameworks and libraries
metalift links, from the symbol lists beside this script, so arm64 Mach-O can be
linked on Linux without an SDK (scripts/macos-build.sh).

    scripts/tbd/gen-tbd.py OUTDIR

Each `NAME.symbols` file lists one library: `@install-name PATH` (the path dyld
loads, as in Apple's SDK), `@framework` when it is a framework, then the
exported symbols it must provide, one per line, Mach-O spelling (leading `_`).
`#` starts a comment. Output:

    OUTDIR/Frameworks/NAME.framework/NAME.tbd   (frameworks: rustc -L framework=OUTDIR/Frameworks)
    OUTDIR/lib/libNAME.tbd                      (libraries:  -L OUTDIR/lib)

A stub only has to satisfy the static linker: the load command it produces names
the install name, and dyld binds against the real library on the Mac. A symbol
missing here fails the link (never a wrong binary), so the lists are exactly
what the linker asked for; `llvm-nm -u` on a linked binary shows them.
"""

import pathlib
import sys

TARGETS = "[ arm64-macos, arm64e-macos ]"


def parse(path):
    install_name, framework, symbols = None, False, []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("@install-name "):
            install_name = line.split(None, 1)[1]
        elif line == "@framework":
            framework = True
        elif line.startswith("@"):
            sys.exit(f"{path}: unknown directive {line}")
        else:
            symbols.append(line)
    if not install_name:
        sys.exit(f"{path}: no @install-name")
    return install_name, framework, sorted(set(symbols))


def tbd(install_name, symbols):
    listed = ", ".join(f"'{s}'" for s in symbols)
    return (
        "--- !tapi-tbd\n"
        "tbd-version:     4\n"
        f"targets:         {TARGETS}\n"
        f"install-name:    '{install_name}'\n"
        "current-version: 1\n"
        "compatibility-version: 1\n"
        "exports:\n"
        f"  - targets:         {TARGETS}\n"
        f"    symbols:         [ {listed} ]\n"
        "...\n"
    )


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen-tbd.py OUTDIR")
    out = pathlib.Path(sys.argv[1])
    here = pathlib.Path(__file__).resolve().parent
    for path in sorted(here.glob("*.symbols")):
        name = path.stem
        install_name, framework, symbols = parse(path)
        if framework:
            target = out / "Frameworks" / f"{name}.framework" / f"{name}.tbd"
        else:
            target = out / "lib" / f"{name}.tbd"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(tbd(install_name, symbols))
        print(f"gen-tbd: {target} ({len(symbols)} symbols)")


if __name__ == "__main__":
    main()
