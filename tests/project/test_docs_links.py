"""The Markdown files link to what exists, and their tables render as tables.

Every relative link ``[text](path#anchor)`` in every ``*.md`` of the repository must name a
file or directory that exists, and its anchor a heading of the target as GitHub spells it
(lower case, punctuation dropped, spaces as hyphens, ``-1``, ``-2`` ... for repeats).  Links
are read with a CommonMark parser (markdown-it-py, with GitHub's tables), so a link inside a
code span or a fenced block is not one, as on GitHub.  A table row that lost its table (a row
after a blank line or a paragraph) renders as a paragraph of pipes; that fails too.
"""

import functools
import itertools
import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
#: Directories that are not the project's documents: tools' caches, the venv, build output.
SKIPPED_PARTS = {"node_modules", "build", "dist"}
SKIPPED_DIRS = {ROOT / "benchmarks" / "results"}


def _markdown_files() -> list[Path]:
    files = []
    for path in sorted(ROOT.rglob("*.md")):
        parts = path.relative_to(ROOT).parts
        if any(p.startswith(".") or p.endswith(".egg-info") or p in SKIPPED_PARTS for p in parts):
            continue
        if any(d in path.parents for d in SKIPPED_DIRS):
            continue
        files.append(path)
    return files


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


def _plain_text(inline) -> str:
    """The text a heading shows: code spans' contents, link texts, no emphasis marks."""
    return "".join(
        child.content for child in inline.children if child.type in ("text", "code_inline")
    )


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (github-slugger): lower case, letters, digits,
    ``_`` and ``-`` kept, each space a ``-``, everything else dropped."""
    kept = []
    for char in heading.lower():
        category = unicodedata.category(char)
        if char in " -" or category[0] in "LMN" or category == "Pc":
            kept.append("-" if char == " " else char)
    return "".join(kept)


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor of ``path``: one per heading (repeats numbered), and explicit ids."""
    tokens = _parser().parse(path.read_text(encoding="utf-8"))
    found, seen = set(), {}
    for opening, inline in itertools.pairwise(tokens):
        if opening.type != "heading_open":
            continue
        slug = github_slug(_plain_text(inline))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    for token in tokens:
        if token.type in ("html_block", "html_inline") or token.children:
            html = token.content + "".join(c.content for c in token.children or ())
            found.update(re.findall(r'<a\s+(?:name|id)="([^"]+)"', html))
    return frozenset(found)


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line, href) of every link and image in ``path`` that is not to another site."""
    links = []
    for token in _parser().parse(path.read_text(encoding="utf-8")):
        for child in token.children or ():
            if child.type not in ("link_open", "image"):
                continue
            href = child.attrs.get("href" if child.type == "link_open" else "src", "")
            if re.match(r"[a-z][a-z0-9+.-]*:", href, re.IGNORECASE) or href.startswith("//"):
                continue  # http:, https:, mailto: ...
            links.append((token.map[0] + 1 if token.map else 0, href))
    return links


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with ``path``'s relative links, one line each (paths from ``root``)."""
    problems = []
    for line, href in relative_links(path):
        target, _, anchor = href.partition("#")
        where = f"{path.relative_to(root)}:{line}: {href}"
        resolved = (path.parent / unquote(target)).resolve() if target else path
        if not resolved.exists():
            problems.append(f"{where}: no file {target}")
        elif anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
            problems.append(f"{where}: no heading #{anchor} in {resolved.relative_to(root)}")
        elif anchor and resolved.suffix != ".md":
            problems.append(f"{where}: an anchor into a file that is not Markdown")
    return problems


def stray_table_rows(path: Path, root: Path = ROOT) -> list[str]:
    """Paragraph lines that start with a pipe: table rows that no table took."""
    tokens = _parser().parse(path.read_text(encoding="utf-8"))
    stray = []
    for opening, inline in itertools.pairwise(tokens):
        if opening.type == "paragraph_open" and inline.type == "inline":
            for offset, text in enumerate(inline.content.splitlines()):
                if text.lstrip().startswith("|"):
                    line = opening.map[0] + 1 + offset
                    stray.append(f"{path.relative_to(root)}:{line}: {text[:60]}")
    return stray


FILES = _markdown_files()


def test_there_are_documents_to_check():
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"README.md", "docs/backends.md", "benchmarks/README.md"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path):
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_tables_render_as_tables(path):
    stray = stray_table_rows(path)
    assert not stray, "table rows outside a table:\n" + "\n".join(stray)


# The checks themselves, on small documents written here: each must fail where it should.


def test_a_heading_slug_is_spelled_as_github_spells_it():
    assert github_slug("2026-11-27, late morning: CLIP's quick_gelu (make bench-zoo)") == (
        "2026-11-27-late-morning-clips-quick_gelu-make-bench-zoo"
    )
    assert github_slug("From a model to a build, and where its time goes") == (
        "from-a-model-to-a-build-and-where-its-time-goes"
    )
    assert github_slug("--json output (schema version 1)") == "--json-output-schema-version-1"


def test_a_missing_file_and_a_missing_anchor_are_reported(tmp_path):
    (tmp_path / "target.md").write_text("# Target\n\n## Same\n\n## Same\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](target.md#same-1) [ok](#a-page) [gone](missing.md) [bad](target.md#other)\n"
        "`[code](nowhere.md)` [site](https://example.org/x#y)\n\n# A page\n"
    )
    problems = [p.split(": ")[1] for p in broken_links(page, root=tmp_path)]
    assert problems == ["missing.md", "target.md#other"]


def test_a_table_row_outside_its_table_is_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("| a | b |\n| --- | --- |\n| 1 | 2 |\n\nText.\n| 3 | 4 |\n")
    stray = stray_table_rows(page, root=tmp_path)
    assert len(stray) == 1 and stray[0].endswith("| 3 | 4 |")
