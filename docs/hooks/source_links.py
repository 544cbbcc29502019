"""mkdocs hook: links from a page to the repository's own files (``../tests/x.py#L12``,
``../deploy/compose.yaml``) lead to a copy of that file in the built site.

The pages keep relative links so they also work when read in the repository; outside
``docs/`` mkdocs would report them as broken. No public repository is known to link
to instead (``mkdocs.yml`` has no ``repo_url``: a made-up one only made every such
link dead), so each linked file is published with the site under ``source/`` (its
path in the repository below that) and the link points there. A link whose file does
not exist (or is a directory: nothing to publish) is reported as a warning, which
fails ``mkdocs build --strict``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.source_links")

LINK = re.compile(r"\]\((?P<path>(?:\.\./)+[^)#\s]+)(?P<anchor>#[^)\s]*)?\)")
#: Where the copies live in the site.
PREFIX = "source"


def _target(docs: Path, page: str, path: str) -> Path | None:
    """The repository file a link of ``page`` names, if it is outside ``docs/``."""
    root = docs.parent
    target = ((docs / page).parent / path).resolve()
    if not target.is_relative_to(root) or target.is_relative_to(docs):
        return None  # inside docs/ (mkdocs checks it) or outside the repository
    return target


def on_files(files: Any, config: Any) -> Any:
    """Publish every repository file a page links to under ``source/``."""
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    wanted: set[Path] = set()
    for page in docs.rglob("*.md"):
        for match in LINK.finditer(page.read_text()):
            target = _target(docs, page.relative_to(docs).as_posix(), match["path"])
            if target is not None and target.is_file():
                wanted.add(target)
    for target in sorted(wanted):
        uri = f"{PREFIX}/{target.relative_to(root).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(target)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    src = page.file.src_path
    depth = src.count("/")

    def rewrite(match: re.Match[str]) -> str:
        target = _target(docs, src, match["path"])
        if target is None:
            return match[0]
        if not target.is_file():
            log.warning("%s links to %s, which is not a file", src, match["path"])
            return match[0]
        relative = target.relative_to(root).as_posix()
        # A docs-relative link to the published copy: mkdocs checks and resolves it.
        return f"]({'../' * depth}{PREFIX}/{relative}{match['anchor'] or ''})"

    return LINK.sub(rewrite, markdown)
