"""Publishing handles beside the app: the blocking one of ``App.connect_sync()`` and
the durable end of an ad-hoc publish chain."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from streamworks.runtime.producer import Producer, Published, Record

if TYPE_CHECKING:
    from collections.abc import Mapping

    from streamworks.app import App

__all__ = ("DurablePublisher", "SyncPublisher")


class SyncPublisher:
    """Blocking publishing handle returned by ``App.connect_sync()``."""

    def __init__(self, app: App, portal: Any) -> None:
        self._app = app
        self._portal = portal

    def publish(
        self,
        stream: str,
        value: Any,
        *,
        key: str | None = None,
        event_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
    ) -> Published:
        result: Published = self._portal.call(
            functools.partial(
                self._app.publish,
                stream,
                value,
                key=key,
                event_id=event_id,
                headers=headers,
                delay=delay,
                at=at,
            )
        )
        return result

    def publish_many(self, stream: str, records: Sequence[Record]) -> list[Published]:
        result: list[Published] = self._portal.call(self._app.publish_many, stream, records)
        return result


class DurablePublisher:
    """The end of an ad-hoc publish chain: the producer with one call's durability."""

    __slots__ = ("_min_replicas", "_producer", "_replica_timeout")

    def __init__(
        self, producer: Producer, min_replicas: int | None, replica_timeout: float | None
    ) -> None:
        self._producer = producer
        self._min_replicas = min_replicas
        self._replica_timeout = replica_timeout

    async def publish_many(self, stream: str, records: Sequence[Record]) -> list[Published]:
        return await self._producer.publish_many(
            stream,
            records,
            min_replicas=self._min_replicas,
            replica_timeout=self._replica_timeout,
        )
