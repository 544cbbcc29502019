"""What the runtime uses of an app: :class:`AppView`, a narrow protocol.

The runtime sits below the app (``app → middleware → runtime``, a contract in
``.importlinter`` that ``make lint`` checks): workers, connections, contexts and the
lifecycle are handed the :class:`~streamworks.App` but know it only through this
protocol, so no module under ``streamworks/runtime/`` imports ``streamworks.app``.
``App`` satisfies it; mypy checks that wherever an ``App`` is handed to the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from streamworks.protocol.codec import Codec
    from streamworks.runtime.chain import HandlingHooks
    from streamworks.runtime.connection import Connection
    from streamworks.runtime.handler import HandlerSpec
    from streamworks.runtime.idempotency import IdempotencyStore
    from streamworks.runtime.producer import Published
    from streamworks.runtime.schedule_spec import ScheduleSpec
    from streamworks.runtime.stream_spec import StreamSpec
    from streamworks.settings import Settings

__all__ = ("AppView", "Hook")

#: ``@app.on_startup``/``@app.on_shutdown``: a function of no arguments, sync or async.
Hook = Callable[[], Any]


class AppView(Protocol):
    """An app as the runtime sees it: declarations, its connection, publishing."""

    # -- declarations ----------------------------------------------------------------
    @property
    def name(self) -> str:
        """The group id."""

    @property
    def settings(self) -> Settings:
        """The app's settings."""

    @property
    def codec(self) -> Codec:
        """The payload codec."""

    @property
    def idempotency_store(self) -> IdempotencyStore | None:
        """The store of ``idempotency_key`` handlers (None: a Redis store)."""

    @property
    def streams(self) -> Mapping[str, StreamSpec]:
        """The declared streams, by name."""

    @property
    def handlers(self) -> Mapping[str, HandlerSpec]:
        """The handlers, by stream."""

    @property
    def schedules(self) -> Mapping[str, ScheduleSpec]:
        """The ``@app.schedule`` declarations, by name."""

    @property
    def handling_hooks(self) -> HandlingHooks:
        """The handling hooks of the app's middleware (composed by ``runtime/chain.py``)."""

    # -- lifecycle (``streamworks/lifecycle.py``) ----------------------------------------
    @property
    def startup_hooks(self) -> Sequence[Hook]:
        """``@app.on_startup`` hooks, in order."""

    @property
    def shutdown_hooks(self) -> Sequence[Hook]:
        """``@app.on_shutdown`` hooks, in order."""

    @property
    def lifespan(self) -> Callable[[Any], AbstractAsyncContextManager[Any]] | None:
        """``App(lifespan=)``: called with the app."""

    # -- the connection and publishing -----------------------------------------------
    @property
    def connection(self) -> Connection:
        """The open connection; raises ``NotConnectedError`` outside one."""

    @property
    def current_connection(self) -> Connection | None:
        """The open connection, or None outside one."""

    def attached(self, connection: Connection) -> AbstractAsyncContextManager[Connection]:
        """Use ``connection`` for the app's publishing while the block runs."""

    async def publish(
        self,
        stream: str,
        value: Any,
        *,
        key: str | None = None,
        event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Published:
        """Publish one message to ``stream``."""

    def publish_sync(
        self,
        stream: str,
        value: Any,
        *,
        key: str | None = None,
        event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Published:
        """Publish from synchronous code."""
