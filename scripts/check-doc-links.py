#!/usr/bin/env python3
"""Checks the links of the front page and the guide, with no network.

Every relative link in README.md, CONTRIBUTING.md and docs/src/**/*.md must name a
file or directory of the repository, and every #anchor a heading of the file it
points into (heading ids as GitHub and mdBook make them: lower case, spaces to
hyphens, punctuation other than '-' and '_' dropped, a repeated heading gets -1,
-2, ...). Every chapter under docs/src/ must be listed in docs/src/SUMMARY.md.
Links with a scheme (https:, mailto:) are not followed: no network.

A chapter is checked as mdBook renders it: its {{#include FILE}},
{{#include FILE:ANCHOR}} and {{#include FILE:START:END}} directives are expanded
first, and the links of an included file are read relative to the chapter. A
link from a chapter must stay inside docs/src: the book holds only that
directory, so a link to ../../CONTRIBUTING.md works on GitHub and is broken in
the built guide (include the file in a chapter, or link to a chapter).

Usage: python3 scripts/check-doc-links.py   (from anywhere; exit 1 on a broken link)
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
INCLUDE = re.compile(r"\{\{#include\s+([^}\s]+)\s*\}\}")
BOOK = ROOT / "docs" / "src"


def in_book(path):
    """Whether a file is a chapter (or other file) of the guide's source."""
    try:
        path.resolve().relative_to(BOOK)
        return True
    except ValueError:
        return False


def included(chapter, spec, problems):
    """The text an {{#include SPEC}} directive puts into a chapter, as mdBook does."""
    file_part, _, selector = spec.partition(":")
    source = (chapter.parent / file_part).resolve()
    if not source.is_file():
        problems.append(f"{chapter.relative_to(ROOT)}: {{{{#include {spec}}}}}: no such file")
        return ""
    lines = source.read_text(encoding="utf-8").splitlines()
    if not selector:
        return "\n".join(lines)
    start, colon, end = selector.partition(":")
    if start.isdigit() or (colon and (start == "" or start.isdigit())):
        first = int(start) - 1 if start else 0
        last = int(end) if end else len(lines)
        return "\n".join(lines[first:last])
    marker = re.compile(rf"ANCHOR(_END)?:\s*{re.escape(selector)}\b")
    picked, inside, found = [], False, False
    for line in lines:
        m = marker.search(line)
        if m:
            found = True
            inside = m.group(1) is None
            continue
        if inside and "ANCHOR" not in line:
            picked.append(line)
    if not found:
        problems.append(
            f"{chapter.relative_to(ROOT)}: {{{{#include {spec}}}}}: no ANCHOR {selector} in {source.relative_to(ROOT)}"
        )
    return "\n".join(picked)


def text_of(path, problems=None):
    """A file's Markdown as rendered: a chapter's include directives expanded."""
    text = path.read_text(encoding="utf-8")
    if not in_book(path):
        return text
    sink = [] if problems is None else problems
    return INCLUDE.sub(lambda m: included(path, m.group(1), sink), text)


def prose_lines(text):
    """The lines outside fenced code blocks, with their line numbers."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading):
    """A heading's id, as GitHub and mdBook make it."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(path, cache={}):
    """Every heading id of a Markdown file."""
    if path not in cache:
        seen = {}
        ids = set()
        for _, line in prose_lines(text_of(path)):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            ids.add(base if n == 0 else f"{base}-{n}")
        cache[path] = ids
    return cache[path]


def links(path, problems=None):
    """(line, target) for every link in a Markdown file's prose (a chapter's
    line numbers count the lines its includes put in)."""
    for number, line in prose_lines(text_of(path, problems)):
        line = INLINE_CODE.sub("", line)
        for m in LINK.finditer(line):
            yield number, m.group(1)


def check(path):
    """The broken links of one file, as messages."""
    problems = []
    for number, target in links(path, problems):
        where = f"{path.relative_to(ROOT)}:{number}"
        if SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if file_part and not dest.exists():
            problems.append(f"{where}: {target}: no such file")
            continue
        try:
            dest.relative_to(ROOT)
        except ValueError:
            problems.append(f"{where}: {target}: outside the repository")
            continue
        if in_book(path) and not in_book(dest):
            problems.append(
                f"{where}: {target}: leaves docs/src, so it is broken in the built guide "
                "(include the file in a chapter with {{#include}}, or link to a chapter)"
            )
            continue
        if anchor:
            if dest.suffix != ".md" or dest.is_dir():
                problems.append(f"{where}: {target}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(dest):
                problems.append(
                    f"{where}: {target}: no heading #{anchor} in {dest.relative_to(ROOT)}"
                )
    return problems


def unlisted_chapters():
    """Chapters under docs/src/ that SUMMARY.md does not list."""
    src = ROOT / "docs" / "src"
    summary = src / "SUMMARY.md"
    listed = {(src / t.partition("#")[0]).resolve() for _, t in links(summary)}
    return [
        f"docs/src/{p.relative_to(src)}: not listed in docs/src/SUMMARY.md"
        for p in sorted(src.rglob("*.md"))
        if p != summary and p.resolve() not in listed
    ]


def main():
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    files += sorted((ROOT / "docs" / "src").rglob("*.md"))
    problems = []
    count = 0
    for f in files:
        count += sum(1 for _ in links(f))
        problems += check(f)
    problems += unlisted_chapters()
    for p in problems:
        print(p)
    print(f"check-doc-links: {len(files)} files, {count} links, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
