"""Check the links of the built documentation site (``make docs`` runs it on ``site/``).

``mkdocs build --strict`` checks the Markdown's links to pages and anchors; this
checks what a reader clicks in the HTML it built — theme, navigation, search, the
published sources included: every relative link (``href``/``src``) must name a file
of the site, and an anchor must name an ``id`` on that page. A dead one fails
(exit 1) with the page and the link.

External links (``http(s)://`` elsewhere) are listed; with ``--external`` each is
asked for too (``HEAD``, then ``GET``), and a failure is reported as a warning only:
the network decides, not the site. One kind is dead without asking: a link to a
reserved name that never resolves (``example.invalid``, ``*.example``, ``*.test``,
``example.com``: RFC 2606), like the placeholder ``repo_url`` the site once had.

    python -m tests.docs.link_check site [--external]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

__all__ = ("check_site", "main")

#: Schemes that are not links to check.
SKIP = ("mailto:", "javascript:", "data:", "tel:")
#: Names reserved never to resolve (RFC 2606): a link there is a placeholder, dead.
RESERVED_TLDS = (".invalid", ".example", ".test", ".localhost")
RESERVED_DOMAINS = ("example.com", "example.org", "example.net")


def _reserved(link: str) -> bool:
    host = (urlsplit(link if "://" in link else f"http:{link}").hostname or "").lower()
    return host.endswith(RESERVED_TLDS) or any(
        host == d or host.endswith("." + d) for d in RESERVED_DOMAINS
    )


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and (name == "id" or tag == "a"):
                self.ids.add(value)
            if (name == "href" and tag in ("a", "link")) or (
                name == "src" and tag in ("img", "script", "iframe", "source")
            ):
                self.links.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(errors="replace"))
    return page


def _target(site: Path, page: Path, link: str) -> Path:
    """The file of the site a relative link of ``page`` leads to."""
    path = unquote(urlsplit(link).path)
    base = site if path.startswith("/") else page.parent
    target = (base / path.lstrip("/")).resolve() if path else page
    if target.is_dir():
        target = target / "index.html"
    return target


def check_site(site: Path) -> tuple[list[str], list[str]]:
    """``(dead internal links, external links)`` of the built site."""
    site = site.resolve()
    pages = sorted(site.rglob("*.html"))
    parsed = {p: _parse(p) for p in pages}
    dead: list[str] = []
    external: set[str] = set()
    for page, content in parsed.items():
        where = page.relative_to(site).as_posix()
        for link in content.links:
            if link.startswith(SKIP):
                continue
            scheme = urlsplit(link).scheme
            if scheme in ("http", "https") or link.startswith("//"):
                if _reserved(link):
                    dead.append(f"{where}: {link} (a reserved name: never resolves)")
                else:
                    external.add(link)
                continue
            if scheme:
                continue  # some other scheme a browser handles itself
            url, anchor = urldefrag(link)
            target = _target(site, page, url)
            if not target.is_relative_to(site) or not target.is_file():
                dead.append(f"{where}: {link} (no such file in the site)")
                continue
            if anchor and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _parse(target).ids
                if unquote(anchor) not in ids:
                    dead.append(f"{where}: {link} (no id {anchor!r} on that page)")
    return dead, sorted(external)


def _ask(links: list[str]) -> Iterator[str]:
    """The external links that do not answer (warnings)."""
    import httpx

    with httpx.Client(timeout=10, follow_redirects=True) as http:
        for link in links:
            try:
                answer = http.head(link)
                if answer.status_code >= 400:
                    answer = http.get(link)
            except httpx.HTTPError as e:
                yield f"{link}: {type(e).__name__}"
                continue
            if answer.status_code >= 400:
                yield f"{link}: HTTP {answer.status_code}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path)
    parser.add_argument("--external", action="store_true", help="also ask each external link")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"link check: {args.site} holds no built site (index.html)", file=sys.stderr)
        return 1
    dead, external = check_site(args.site)
    for line in dead:
        print(f"dead link: {line}", file=sys.stderr)
    print(f"link check: {len(dead)} dead internal links, {len(external)} external links")
    if args.external:
        for line in _ask(external):
            print(f"warning: external link does not answer: {line}", file=sys.stderr)
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main())
