"""The handling chain: an app's handling middleware composed around one handler.

The runtime sits below the middleware (``app → middleware → runtime``, a contract in
``.importlinter``), so it does not know :class:`~streamworks.Middleware`: it receives
the hooks the app's middleware overrides, already picked
(:func:`streamworks.middleware.handling_hooks`, reached through
``AppView.handling_hooks``), and composes them here, once per handler when a worker
starts. An app without handling middleware gets no chain: the plain path.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamworks.runtime.message import Context, Message

__all__ = ("DeadLetterHook", "HandleHook", "HandleNext", "HandlingChain", "HandlingHooks")

# The logger of ``streamworks/middleware.py``: where a user looks for their hooks' failures.
log = logging.getLogger("streamworks.middleware")

#: ``call_next`` of :meth:`Middleware.handle <streamworks.Middleware.handle>`.
HandleNext = Callable[["Context"], Awaitable[None]]
#: A bound ``Middleware.handle``: ``hook(ctx, call_next)``.
HandleHook = Callable[["Context", HandleNext], Awaitable[None]]
#: A bound ``Middleware.dead_lettered``: ``hook(message, reason, error)``.
DeadLetterHook = Callable[["Message", str, str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class HandlingHooks:
    """The handling hooks an app's middleware overrides, outermost first."""

    handle: tuple[HandleHook, ...] = ()
    dead_lettered: tuple[DeadLetterHook, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.handle or self.dead_lettered)


def _handle_layer(hook: HandleHook, call_next: HandleNext) -> HandleNext:
    async def call(ctx: Context) -> None:
        await hook(ctx, call_next)

    return call


class HandlingChain:
    """An app's handling middleware around one handler, composed once per worker.

    Args:
        hooks: the app's handling hooks, outermost first.
        call: runs the handler itself: ``call(value, message, ctx)``.
    """

    __slots__ = ("_dead_letter_hooks", "_run")

    def __init__(self, hooks: HandlingHooks, call: Callable[..., Awaitable[None]]):
        async def handler(ctx: Context) -> None:
            await call(ctx.value, ctx.message, ctx)

        run: HandleNext = handler
        for hook in reversed(hooks.handle):
            run = _handle_layer(hook, run)
        self._run = run
        self._dead_letter_hooks = hooks.dead_lettered

    @classmethod
    def build(
        cls, hooks: HandlingHooks, call: Callable[..., Awaitable[None]]
    ) -> HandlingChain | None:
        """The chain, or None when no middleware wraps handling (the plain path)."""
        return cls(hooks, call) if hooks else None

    async def run(self, ctx: Context, value: Any) -> None:
        """Run the chain and the handler on ``value``; raises what the chain raised."""
        ctx.value = value
        await self._run(ctx)

    async def dead_lettered(self, message: Message, reason: str, error: str) -> None:
        """Tell every middleware; a hook that fails is logged and the others still run."""
        for hook in self._dead_letter_hooks:
            try:
                await hook(message, reason, error)
            except Exception:
                log.exception("middleware dead_lettered hook %r failed", hook)
