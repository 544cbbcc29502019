"""What every command shares: settings from flags and env, app loading, error lines."""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import click
from pydantic import ValidationError
from redis.exceptions import RedisError

from streamworks.app import App
from streamworks.exceptions import CoordinatorError, StreamworksError
from streamworks.settings import Settings

__all__ = (
    "configure_logging",
    "coordinator_options",
    "fail",
    "load_app",
    "make_settings",
    "redis_options",
    "run_async",
    "safe_url",
)

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> None:
    """Print one clear error line and exit."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def redis_options(fn: F) -> F:
    fn = click.option("--key-prefix", help="key namespace [env STREAMWORKS_KEY_PREFIX]")(fn)
    return click.option("--redis", "redis_url", help="Redis URL [env STREAMWORKS_REDIS_URL]")(fn)


def coordinator_options(fn: F) -> F:
    fn = click.option("--admin-token", help="admin bearer token [env STREAMWORKS_ADMIN_TOKEN]")(fn)
    fn = click.option("--token", help="bearer token [env STREAMWORKS_TOKEN]")(fn)
    return click.option(
        "--coordinator",
        "coordinator_urls",
        help="coordinator URL(s), comma-separated [env STREAMWORKS_COORDINATOR_URLS]",
    )(fn)


def make_settings(**flags: Any) -> Settings:
    """Settings from the environment, overridden by the flags that were given."""
    try:
        settings = Settings()
    except ValidationError as e:
        fail(f"invalid STREAMWORKS_* setting: {_first_error(e)}")
        raise  # unreachable
    changes: dict[str, Any] = {}
    for name, value in flags.items():
        if value is None:
            continue
        if name == "coordinator_urls":
            value = [u.strip() for u in value.split(",") if u.strip()]
        changes[name] = value
    try:
        return Settings.model_validate({**settings.model_dump(), **changes})
    except ValidationError as e:
        fail(f"invalid option: {_first_error(e)}")
        raise


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


def load_app(target: str) -> App:
    """Import ``module:attribute`` (the attribute defaults to ``app``)."""
    module_name, _, attribute = target.partition(":")
    attribute = attribute or "app"
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        fail(f"cannot import module {module_name!r}: {e}")
    except Exception as e:  # the user's module raised while importing
        fail(f"importing {module_name!r} failed: {type(e).__name__}: {e}")
    app = getattr(module, attribute, None)
    if app is None:
        fail(f"module {module_name!r} has no attribute {attribute!r}")
    if not isinstance(app, App):
        fail(f"{target} is a {type(app).__name__}, not a streamworks.App")
    assert isinstance(app, App)
    return app


def run_async(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """Run an async command on uvloop (when installed), turning expected failures
    into one error line."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return anyio.run(
                functools.partial(fn, *args, **kwargs),
                backend="asyncio",
                backend_options={"use_uvloop": _has_uvloop()},
            )
        except CoordinatorError as e:
            fail(f"coordinator: {e.code}: {e.message}")
        except (RedisError, ConnectionError) as e:
            fail(f"Redis: {e}")
        except StreamworksError as e:
            fail(str(e))
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def safe_url(url: str) -> str:
    """``url`` with any password masked (URLs are printed; secrets never are)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
