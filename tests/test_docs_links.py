"""Every relative link in the README, docs/ and the committed results' pages points at a file that exists.

The README links to the pages under docs/ and to experiments/results/; a page moved or renamed without its links
fails here rather than in a reader's browser.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "experiments" / "results").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def broken_links(page: Path) -> list[str]:
    """The relative link targets in ``page`` (anchors dropped) that name no file or folder."""
    targets = (m.group(1) for m in LINK.finditer(page.read_text()))
    return [t for t in targets
            if not re.match(r"[a-z]+:", t) and not t.startswith("#") and not (page.parent / t.split("#")[0]).exists()]


def test_the_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "here.md").write_text("")
    page.write_text("[ok](here.md#a) [web](https://example.org) [gone](docs/nowhere.md) [anchor](#top)")
    assert broken_links(page) == ["docs/nowhere.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


URL = re.compile(r"\b(?:https?|ftp)://\S+")


def test_no_page_points_outside_the_repository():
    """The repository stands on its own: its pages cite what it holds (logs, which quote other tools' messages,
    are not pages)."""
    assert URL.findall("see https://example.org/x and [a](http://b.c)") == ["https://example.org/x",
                                                                             "http://b.c)"]
    outside = {str(p.relative_to(ROOT)): URL.findall(p.read_text()) for p in PAGES}
    assert {page: urls for page, urls in outside.items() if urls} == {}
