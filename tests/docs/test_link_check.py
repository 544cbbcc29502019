"""The link check of ``make docs`` (``tests/docs/link_check.py``) fails on what a reader
would find dead in the built site, and only on that."""

from __future__ import annotations

from pathlib import Path

from tests.docs.link_check import check_site, main


def site(tmp_path: Path, pages: dict[str, str]) -> Path:
    root = tmp_path / "site"
    for name, body in pages.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"<html><body>{body}</body></html>")
    return root


def test_a_good_site_passes(tmp_path: Path) -> None:
    root = site(
        tmp_path,
        {
            "index.html": '<a href="guide/">guide</a> <a href="guide/#part">part</a>'
            ' <a href="https://pypi.org/project/redis/">redis</a> <a href="#top" id="top">top</a>'
            ' <img src="img/x.png">',
            "guide/index.html": '<h2 id="part">part</h2><a href="../">home</a>',
            "img/x.png": "",
        },
    )
    dead, external = check_site(root)
    assert dead == []
    assert external == ["https://pypi.org/project/redis/"]
    assert main([str(root)]) == 0


def test_dead_links_fail(tmp_path: Path) -> None:
    root = site(
        tmp_path,
        {
            "index.html": '<a href="missing/">gone</a> <a href="guide/#nowhere">anchor</a>'
            ' <a href="https://example.invalid/streamworks/blob/main/tests/x.py">source</a>',
            "guide/index.html": "<h2 id='part'>part</h2>",
        },
    )
    dead, _ = check_site(root)
    assert [d.split(" (", 1)[1] for d in dead] == [
        "no such file in the site)",
        "no id 'nowhere' on that page)",
        "a reserved name: never resolves)",
    ], dead
    assert main([str(root)]) == 1
