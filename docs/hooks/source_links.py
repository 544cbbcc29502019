"""mkdocs hook: links from a page to the repository's own files (``../tests/x.py#L12``,
``../deploy/compose.yaml``) point at the repository on the built site.

The pages keep relative links so they also work when read in the repository; mkdocs
would report them as broken, since they lead outside ``docs/``. A link whose file does
not exist is reported as a warning, which fails ``mkdocs build --strict``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.source_links")

LINK = re.compile(r"\]\((?P<path>(?:\.\./)+[^)#\s]+)(?P<anchor>#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    page_dir = (docs / page.file.src_path).parent
    base = str(config["repo_url"]).rstrip("/")

    def rewrite(match: re.Match[str]) -> str:
        target = (page_dir / match["path"]).resolve()
        if not target.is_relative_to(root) or target.is_relative_to(docs):
            return match[0]  # inside docs/ (mkdocs checks it) or outside the repository
        if not target.exists():
            log.warning("%s links to %s, which does not exist", page.file.src_path, match["path"])
            return match[0]
        kind = "tree" if target.is_dir() else "blob"
        relative = target.relative_to(root).as_posix()
        return f"]({base}/{kind}/main/{relative}{match['anchor'] or ''})"

    return LINK.sub(rewrite, markdown)
