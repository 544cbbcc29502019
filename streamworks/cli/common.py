"""What every command shares: settings from flags and env, app loading, error lines."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import anyio
import click
from pydantic import ValidationError
from redis.exceptions import RedisError

from streamworks.app import App
from streamworks.cli.logs import LEVELS, ContextFilter
from streamworks.cli.logs import configure_logging as _configure_logging
from streamworks.exceptions import (
    ConfigurationError,
    CoordinatorError,
    NamespaceMismatchError,
    StreamworksError,
)
from streamworks.settings import Settings

__all__ = (
    "EXIT_FAILED",
    "EXIT_USAGE",
    "check_redis_url",
    "configure_logging",
    "coordinator_options",
    "fail",
    "load_app",
    "logging_options",
    "make_settings",
    "plural",
    "redis_options",
    "run_async",
    "safe_url",
)

F = TypeVar("F", bound=Callable[..., Any])


#: Exit codes, one table for every command (docs/cli.md, tests/e2e/test_exit_codes.py).
EXIT_FAILED = 1  # the operation failed: Redis or the coordinator unreachable or refusing, ...
EXIT_USAGE = 2  # fix the command line: usage, a name, a URL, a port in use, --yes needed


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print one clear error line and exit."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 shard``, ``2 shards`` (``many`` when adding an s is wrong)."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


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
        result = Settings.model_validate({**settings.model_dump(), **changes})
    except ValidationError as e:
        fail(f"invalid option: {_first_error(e)}")
        raise
    check_redis_url(result.redis_url)
    return result


#: URL schemes redis-py connects with.
REDIS_SCHEMES = ("redis", "rediss", "unix")


def check_redis_url(url: str) -> None:
    """Exit with one line (code 2) when ``url`` is not a Redis URL (or, for a Redis
    Cluster, a comma-separated list of its seed nodes' URLs)."""
    from urllib.parse import urlsplit

    from streamworks.redis.client import seed_urls

    try:
        seeds = seed_urls(url)
    except ValueError:
        seeds = [url]  # blank: the scheme check below says what is wrong
    for seed in seeds:
        if urlsplit(seed).scheme not in REDIS_SCHEMES:
            fail(
                f"invalid Redis URL {safe_url(seed)!r}: it must start with redis://, "
                "rediss:// or unix:// (--redis or STREAMWORKS_REDIS_URL; several URLs, "
                "comma-separated, for a cluster's seed nodes)",
                2,
            )
    if len(seeds) > 1 and any(s.startswith("unix:") for s in seeds):
        fail("a Redis Cluster's seed nodes are TCP URLs (redis:// or rediss://), not unix://", 2)


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
        missing = e.name or ""
        if missing and not _is_target(missing, module_name):
            # The app module was found; something it imports was not.
            fail(
                f"importing {module_name!r} failed: it imports {missing!r}, which is not "
                f"installed or not on the path ({e})"
            )
        fail(f"cannot import module {module_name!r}: {e} (is the module path right?)")
    except Exception as e:  # the user's module raised while importing
        frames = user_frames(e)
        where = ""
        if frames:
            # The user's own frames, as Python would print them, then the one line.
            listing = "".join(traceback.format_list(frames))
            click.echo(
                f"Traceback (most recent call last; your code only):\n{listing}", err=True, nl=False
            )
            where = f" ({frames[-1].filename}, line {frames[-1].lineno})"
        fail(f"importing {module_name!r} failed: {type(e).__name__}: {e}{where}")
    app = getattr(module, attribute, None)
    if app is None:
        fail(f"module {module_name!r} has no attribute {attribute!r}")
    if not isinstance(app, App):
        fail(f"{target} is a {type(app).__name__}, not a streamworks.App")
    assert isinstance(app, App)
    return app


#: Frames of these directories are the framework's or the import system's, not the
#: user's: left out of an import error's traceback.
_NOT_USER = (str(Path(__file__).resolve().parents[1]), str(Path(importlib.__file__).parent))


def user_frames(error: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``error``'s traceback that are the user's code: not streamworks',
    not the import machinery's (``<frozen importlib._bootstrap>`` and friends)."""
    return [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<frozen ")
        and not str(Path(frame.filename).resolve()).startswith(_NOT_USER)
    ]


def _is_target(missing: str, module_name: str) -> bool:
    """Whether the missing module is the app module itself or one of its packages."""
    return module_name == missing or module_name.startswith(missing + ".")


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
            fail(f"coordinator: {e.code}: {e.message}", _coordinator_exit(e))
        except (RedisError, ConnectionError) as e:
            fail(f"Redis: {e}")
        except NamespaceMismatchError as e:
            fail(str(e))  # the operation was refused: this Redis is not the coordinator's
        except ConfigurationError as e:
            fail(str(e), EXIT_USAGE)  # an unknown name, an invalid selection
        except StreamworksError as e:
            cause = e.__cause__
            if isinstance(cause, CoordinatorError) and cause.code == "NOT_FOUND":
                # A publish's routing wraps the coordinator's answer: say what it means.
                fail(f"{cause.message} (see streamworks streams ls)", EXIT_USAGE)
            fail(str(e))
        except ValidationError as e:  # a request model refused an argument
            fail(f"invalid argument: {_first_error(e)}", 2)
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper


def _coordinator_exit(error: CoordinatorError) -> int:
    """An unknown stream or group is a mistake on the command line (exit 2), like an
    invalid name; anything else the coordinator refuses is a failed operation."""
    return EXIT_USAGE if error.code == "NOT_FOUND" else EXIT_FAILED


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def record_history() -> None:
    """``STREAMWORKS_HISTORY_FILE``: append this process's protocol steps to that file,
    for the trace check of a test run (``docs/protocol-model.md``). Unset: nothing is
    recorded, and the testing package is not even imported."""
    if os.environ.get("STREAMWORKS_HISTORY_FILE"):
        from streamworks.testing.history import install_from_environment

        install_from_environment()


def configure_logging(level: str, fmt: str = "text") -> ContextFilter:
    """Log to stderr at ``level`` as ``fmt`` (``text`` or ``json``, see cli/logs.py)."""
    return _configure_logging(level, fmt)


def logging_options(default_level: str) -> Callable[[F], F]:
    """``--log-level`` (a choice, any case) and ``--log-format`` (text or json)."""

    def decorate(fn: F) -> F:
        fn = click.option(
            "--log-format",
            type=click.Choice(["text", "json"], case_sensitive=False),
            default="text",
            show_default=True,
            help="json: one JSON object per line (level, logger, message, group, member, ...)",
        )(fn)
        return click.option(
            "--log-level",
            type=click.Choice(LEVELS, case_sensitive=False),
            default=default_level,
            show_default=True,
        )(fn)

    return decorate


def safe_url(url: str) -> str:
    """``url`` with any password masked (URLs are printed; secrets never are)."""
    from streamworks.redis.client import masked_url

    return masked_url(url)
