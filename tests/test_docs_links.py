"""Every relative link of the README and docs/ leads somewhere: the file exists and, for a
`#anchor` into a Markdown page, the page has a heading with that anchor (GitHub's rule: lower
case, punctuation but `-` and `_` dropped, spaces to `-`, `-1`, `-2` for repeats). Links to
URLs are not fetched (no network here)."""
from __future__ import annotations

import re
from pathlib import Path

from harness import REPO

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text()).splitlines():
        m = re.match(r"^#{1,6} (.*)$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    bad = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


def test_every_relative_link_of_the_readme_and_docs_resolves():
    bad = {p.name: b for p in pages() if (b := broken_links(p))}
    assert not bad, bad


def test_the_checker_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title here\n\n## Step 1. Build it\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#step-1-build-it) [gone](c.md) [bad](a.md#step-2)\n"
                    "```\n[in code](nowhere.md)\n```\n")
    bad = broken_links(page)
    assert len(bad) == 2 and "c.md" in bad[0] and "#step-2" in bad[1], bad
