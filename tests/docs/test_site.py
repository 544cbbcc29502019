"""The documentation site a newcomer lands on (issue 22, item 10): a home page at the
root, install and FAQ pages, no made-up repository to link to, a link check in
``make docs``, and a README that says production needs two coordinator replicas."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def config() -> dict[str, object]:
    text = (ROOT / "mkdocs.yml").read_text()
    return yaml.safe_load(text)  # type: ignore[no-any-return]


def nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return []


def test_the_root_is_a_page_and_install_and_faq_are_in_the_nav() -> None:
    pages = nav_pages(config()["nav"])
    assert pages[0] == "index.md" and (ROOT / "docs" / "index.md").is_file()
    for page in ("install.md", "faq.md", "quickstart.md"):
        assert page in pages and (ROOT / "docs" / page).is_file(), page
    assert set(pages) == {p.name for p in (ROOT / "docs").glob("*.md")}


def test_no_made_up_repository() -> None:
    settings = config()
    assert "repo_url" not in settings and "edit_uri" not in settings
    for page in (ROOT / "docs").glob("*.md"):
        assert "example.invalid" not in page.read_text(), page.name


def test_make_docs_checks_the_built_links() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^docs:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe is not None
    assert "mkdocs build --strict" in recipe[1]
    assert "-m tests.docs.link_check site" in recipe[1]


def test_the_readme_asks_for_two_coordinator_replicas_and_says_why() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "one or more replicas" not in readme
    assert "at least two coordinator replicas" in readme
    why = readme[readme.index("at least two coordinator replicas") :][:700]
    assert "lease" in why and "rolling update" in why, why
