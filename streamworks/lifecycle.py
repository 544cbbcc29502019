"""The app's lifecycle: ``@app.on_startup``, ``@app.on_shutdown`` and ``App(lifespan=)``.

:func:`open_lifespan` is what a worker process (``open_worker``), ``streamworks dev``
and ``TestRuntime`` enter once the app is connected and before any worker joins the
group, and exit after the workers have left and their in-flight work has ended::

    startup hooks (in order) → lifespan entered → workers run → lifespan exited
    → shutdown hooks (in order)

A startup hook or a lifespan that raises aborts the start with
:class:`~streamworks.StartupError` (nothing of the shutdown runs: the start never
completed). Shutdown always runs to the end once the start completed, even when the
process stops because of an error or a cancellation: each hook gets its turn (a
failure is logged), within ``shutdown_timeout`` seconds in all.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from streamworks.exceptions import StartupError

if TYPE_CHECKING:
    from streamworks.runtime.app_view import AppView, Hook

__all__ = ("open_lifespan", "unwrap_startup_error")

log = logging.getLogger("streamworks.lifecycle")


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:
        text = "<unprintable>"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


async def _run(hook: Hook) -> None:
    if inspect.iscoroutinefunction(hook):
        await hook()
        return
    # Plain functions may block (open a pool, read a file) or call publish_sync,
    # which needs to be off the event loop's thread: like sync handlers, a thread.
    result = await anyio.to_thread.run_sync(hook)
    if inspect.isawaitable(result):
        await result  # a plain function returning a coroutine, e.g. a lambda


@contextlib.asynccontextmanager
async def open_lifespan(app: AppView, *, shutdown_timeout: float = 30.0) -> AsyncIterator[None]:
    """Run ``app``'s startup hooks and lifespan, the block, then its shutdown hooks.

    Raises:
        StartupError: a startup hook or the lifespan's entry raised.
    """
    for hook in list(app.startup_hooks):
        try:
            await _run(hook)
        except Exception as e:
            raise StartupError(
                f"app {app.name!r}: startup hook {_name(hook)} failed: {_describe(e)}"
            ) from e
    async with contextlib.AsyncExitStack() as stack:
        if app.lifespan is not None:
            try:
                await stack.enter_async_context(app.lifespan(app))
            except Exception as e:
                raise StartupError(
                    f"app {app.name!r}: lifespan {_name(app.lifespan)} failed: {_describe(e)}"
                ) from e
        try:
            yield
        finally:
            # Shielded: a process stopping because of a cancellation (a crashed task, a
            # test tearing down) still releases what its startup acquired, in bounded time.
            with anyio.move_on_after(shutdown_timeout, shield=True) as scope:
                try:
                    await stack.aclose()
                except Exception:
                    log.exception("app %r: lifespan %s failed on exit", app.name, app.lifespan)
                await _shutdown(app)
            if scope.cancelled_caught:
                log.error(
                    "app %r: shutdown hooks did not finish within %.1fs", app.name, shutdown_timeout
                )


async def _shutdown(app: AppView) -> None:
    for hook in list(app.shutdown_hooks):
        try:
            await _run(hook)
        except Exception:
            log.exception("app %r: shutdown hook %s failed", app.name, _name(hook))


def unwrap_startup_error(error: BaseExceptionGroup[Any]) -> StartupError | None:
    """The :class:`StartupError` a task group wrapped, when it is all the group holds
    (so a process can report it as one line rather than an exception group)."""
    leaves: list[BaseException] = []

    def collect(group: BaseExceptionGroup[Any]) -> None:
        for item in group.exceptions:
            if isinstance(item, BaseExceptionGroup):
                collect(item)
            else:
                leaves.append(item)

    collect(error)
    if len(leaves) == 1 and isinstance(leaves[0], StartupError):
        return leaves[0]
    return None
