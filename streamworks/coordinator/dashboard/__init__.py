"""The coordinator's read-only web dashboard at ``/ui`` (``docs/dashboard.md``).

Server-rendered with Jinja2 from the replica's observations
(``coordinator/observation.py``); a small script swaps in fresh panels every 2 s.
Templates, stylesheet and script ship inside this package: no build step, no CDN.
"""

from __future__ import annotations

from streamworks.coordinator.dashboard.routes import dashboard_router

__all__ = ("dashboard_router",)
