"""The handling chain below the middleware: ``middleware.handling_hooks`` picks the
hooks a middleware overrides, ``runtime/chain.py`` composes them around a handler,
and ``App`` exposes both the hooks and its connection through the runtime's
``AppView`` protocol."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from streamworks import App, Context, Message, Middleware
from streamworks.exceptions import NotConnectedError
from streamworks.middleware import HandleNext, handling_hooks
from streamworks.runtime.chain import HandlingChain, HandlingHooks


class Tagging(Middleware):
    def __init__(self, tag: str, seen: list[str]) -> None:
        self.tag = tag
        self.seen = seen

    async def handle(self, ctx: Context, call_next: HandleNext) -> None:
        self.seen.append(f"{self.tag}>")
        await call_next(ctx)
        self.seen.append(f"<{self.tag}")


class Mourning(Middleware):
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    async def dead_lettered(self, message: Message, reason: str, error: str) -> None:
        self.seen.append(f"dead:{reason}")


class Failing(Middleware):
    async def dead_lettered(self, message: Message, reason: str, error: str) -> None:
        raise RuntimeError("hook failed")


class PublishOnly(Middleware):
    async def publish(self, stream: str, records: Any, call_next: Any) -> Any:
        return await call_next(stream, records)


def test_only_overridden_hooks_are_picked_in_order() -> None:
    seen: list[str] = []
    outer, inner, mourning = Tagging("a", seen), Tagging("b", seen), Mourning(seen)
    hooks = handling_hooks([outer, PublishOnly(), mourning, inner])
    assert hooks.handle == (outer.handle, inner.handle)
    assert hooks.dead_lettered == (mourning.dead_lettered,)
    # Publish-only middleware wraps no handling: the runtime takes the plain path.
    assert not handling_hooks([PublishOnly(), Middleware()])
    assert HandlingChain.build(handling_hooks([PublishOnly()]), _never) is None


async def _never(value: Any, message: Message, ctx: Context) -> None:
    raise AssertionError("not called")


def test_chain_runs_outermost_first_and_tells_every_dead_letter_hook() -> None:
    seen: list[str] = []
    app = App("hooks", middleware=[Tagging("a", seen), Failing(), Mourning(seen)])
    app.middleware = (*app.middleware, Tagging("b", seen))  # as `streamworks dev` adds one

    async def handler(value: Any, message: Message, ctx: Context) -> None:
        seen.append(f"handler:{value}")

    chain = HandlingChain.build(app.handling_hooks, handler)
    assert chain is not None
    message = Message("1-0", "orders", "orders/0@0", b"{}")
    ctx = Context(app, message, logging.getLogger("test"), "m1")

    async def main() -> None:
        await chain.run(ctx, 7)
        await chain.dead_lettered(message, "max_attempts", "boom")

    anyio.run(main)
    # Failing's hook raised: logged, and the next hook still ran.
    assert seen == ["a>", "b>", "handler:7", "<b", "<a", "dead:max_attempts"]


def test_app_is_an_app_view_without_a_connection() -> None:
    app = App("views")
    assert app.current_connection is None
    assert app.handling_hooks == HandlingHooks()
    with pytest.raises(NotConnectedError):
        app.connection  # noqa: B018
