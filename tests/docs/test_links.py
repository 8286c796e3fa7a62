"""The repository stands alone: every relative link of README.md and docs/ (``docs/**.md``)
leads to a file of the repository (a ``#heading`` to a heading of it), every doc that a
file cites by its path under docs/ exists, and no tracked file outside the generated
``reports/`` refers to a ``shared`` folder beside the repository, which a clone does not
have."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

SIBLING = "../" + "shared"  # spelt in two parts so that this file does not hold it
#: inline links and images [text](target "title"), and reference definitions [label]: target
INLINE = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
CITED = re.compile(r"(?<![\w./-])docs/[\w./-]*?\.md\b")


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, code blocks and code spans left out."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE.findall(prose) + DEFINITION.findall(prose)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (``-`` and
    ``_`` kept), spaces to ``-``."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE)}


def broken(path: Path, root: Path = REPO) -> list[str]:
    """The relative links of the Markdown file ``path`` that lead nowhere, or out of ``root``."""
    out = []
    for target in links(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto:, ...
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{target} (no such file)")
        elif not dest.resolve().is_relative_to(root.resolve()):
            out.append(f"{target} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
            out.append(f"{target} (no heading #{anchor} in {dest.name})")
    return out


def tracked_files() -> list[Path]:
    """The files git tracks (a fresh clone's), else every file but generated and
    environment folders."""
    try:
        done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60)
        return [REPO / name for name in done.stdout.decode().split("\0") if name]
    except (OSError, subprocess.SubprocessError):  # no git, or no clone: walk the tree
        found = []
        for folder, dirs, files in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in {".git", ".venv", "results", "__pycache__", ".reference"}]
            found += [Path(folder) / f for f in files]
        return found


def outside_reports() -> list[Path]:
    return [p for p in tracked_files() if p.relative_to(REPO).parts[0] != "reports" and p.is_file()]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path):
    assert not broken(path), f"{path.relative_to(REPO)}: broken links: {broken(path)}"


def test_the_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok too](there.md#a-heading) [web](https://example.org/x) `[code](nowhere.md)`\n"
                    "```\n[fenced](nowhere.md)\n```\n[gone](missing.md) ![img](pic.png) [bad anchor](there.md#other)\n"
                    "[def]: also_missing.md\n")
    assert broken(page, tmp_path) == ["missing.md (no such file)", "pic.png (no such file)",
                            "there.md#other (no heading #other in there.md)", "also_missing.md (no such file)"]
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "page.md").write_text("[out of the repository](../there.md)\n")
    assert broken(tmp_path / "inner" / "page.md", tmp_path / "inner") == ["../there.md (outside the repository)"]


def test_every_doc_cited_by_path_exists():
    missing = sorted({f"{p.relative_to(REPO)}: {ref}" for p in outside_reports() if p.suffix != ".png"
                      for ref in CITED.findall(p.read_text(encoding="utf-8", errors="replace"))
                      if not (REPO / ref).is_file()})
    assert not missing, missing


def test_no_tracked_file_refers_to_a_shared_folder_beside_the_repository():
    found = sorted(str(p.relative_to(REPO)) for p in outside_reports()
                   if SIBLING.encode() in p.read_bytes())
    assert not found, f"these files refer to {SIBLING}, which a clone of the repository does not have: {found}"
