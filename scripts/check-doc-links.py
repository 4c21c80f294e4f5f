#!/usr/bin/env python3
"""Checks the links of the front page and the guide, with no network.

Every relative link in README.md, CONTRIBUTING.md and docs/src/**/*.md must name a
file or directory of the repository, and every #anchor a heading of the file it
points into (heading ids as GitHub and mdBook make them: lower case, spaces to
hyphens, punctuation other than '-' and '_' dropped, a repeated heading gets -1,
-2, ...). Every chapter under docs/src/ must be listed in docs/src/SUMMARY.md.
Links with a scheme (https:, mailto:) are not followed: no network.

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
        for _, line in prose_lines(path.read_text(encoding="utf-8")):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            ids.add(base if n == 0 else f"{base}-{n}")
        cache[path] = ids
    return cache[path]


def links(path):
    """(line, target) for every link in a Markdown file's prose."""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        line = INLINE_CODE.sub("", line)
        for m in LINK.finditer(line):
            yield number, m.group(1)


def check(path):
    """The broken links of one file, as messages."""
    problems = []
    for number, target in links(path):
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
