"""An app module whose dependency is not installed (``streamworks worker`` must name
the missing dependency, not report the app module as missing)."""

from __future__ import annotations

import no_such_dependency_for_streamworks_tests  # noqa: F401

from streamworks import App

app = App("never")
