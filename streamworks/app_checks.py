"""Checks of what an app is given at declaration time (hooks, producer routes).

Kept apart from :mod:`streamworks.app` so the application object stays readable; each
raises :class:`~streamworks.exceptions.ConfigurationError` with one clear line.
"""

from __future__ import annotations

import inspect
from typing import Any

from streamworks.exceptions import ConfigurationError
from streamworks.runtime.app_view import Hook


def check_delay_parameters(fn: Any) -> None:
    """``delay``/``at`` of a producer route's call are the publish's, never the function's."""
    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return
    clash = sorted(names & {"delay", "at"})
    if clash:
        raise ConfigurationError(
            f"@app.producer function {getattr(fn, '__qualname__', fn)!r} has a parameter "
            f"named {clash[0]!r}: that name is the publish's (delayed messages); rename it"
        )


def check_hook(kind: str, fn: Any) -> Hook:
    if not callable(fn):
        raise ConfigurationError(f"@app.{kind} needs a function, not {fn!r}")
    try:
        inspect.signature(fn).bind()
    except TypeError:
        raise ConfigurationError(
            f"@app.{kind} hook {getattr(fn, '__qualname__', fn)!r} must take no arguments"
        ) from None
    except ValueError:
        pass  # no signature to inspect (some builtins): trust it
    hook: Hook = fn
    return hook
