"""The producer's side of a delayed message: the ``delay_add.lua`` call and its reply.

Kept apart from ``producer.py`` (which routes, batches and re-routes every publish) so
that the delayed path is read in one place: which keys the script takes (all in the
shard's slot, docs/design/scheduling.md §2) and what each reply means for
:class:`~streamworks.runtime.producer.Published`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamworks.delay import Due
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts
from streamworks.redis.wire import Arg
from streamworks.runtime.routing import ShardRoute

if TYPE_CHECKING:
    from streamworks.runtime.producer import Published

__all__ = ("delay_add_command", "parse_delay_add")


def delay_add_command(
    scripts: Scripts,
    keyspace: Keyspace,
    route: ShardRoute,
    event_id: str | None,
    window_ms: int | None,
    due: Due,
    offset_ms: int,
    fields: list[bytes | str],
) -> list[Arg]:
    """The ``EVALSHA`` of ``delay_add.lua`` for one record routed to ``route``.

    With an event id and a dedup window the shard's dedup record is the sixth key (the
    one ``publish_dedup.lua`` uses: an event published at once and again delayed is one
    message). ``offset_ms`` is the clock offset (0 in production; ``TestRuntime.advance``
    moves it, so a delay counts from the test's now)."""
    shard = route.shard
    keys: list[Arg] = [
        route.key,
        keyspace.delayed(shard),
        keyspace.delayed_entries(shard),
        keyspace.delayed_counter(shard),
        keyspace.delayed_wake(shard),
    ]
    window = 0
    if window_ms and event_id is not None:
        keys.append(keyspace.dedup(shard, event_id))
        window = window_ms
    kind, ms = due.script_args()
    return [
        "EVALSHA",
        scripts.delay_add.sha,
        len(keys),
        *keys,
        kind,
        ms,
        offset_ms,
        window,
        *fields,
    ]


def parse_delay_add(reply: Any, stream: str, shard: str, version: int) -> Published | None:
    """The :class:`Published` of a ``delay_add.lua`` reply; None when the shard key is
    gone (retired by a scale-in: nothing was written, the producer re-routes)."""
    from streamworks.runtime.producer import Published  # producer imports this module

    status = int(reply[0])
    if status == -1:
        return None
    if status == 1:  # due already: in the stream now
        return Published(stream, shard, _text(reply[1]), version, due_ms=int(reply[2]))
    if status == 2:  # stored until due
        return Published(
            stream, shard, None, version, delay_id=_text(reply[1]), due_ms=int(reply[2])
        )
    # status 0, a duplicate: the dedup record holds the entry id, or 'delayed:<id>'
    # while the earlier message still waits.
    previous = _text(reply[1])
    if previous.startswith("delayed:"):
        return Published(
            stream, shard, None, version, duplicate=True, delay_id=previous.removeprefix("delayed:")
        )
    return Published(stream, shard, previous, version, duplicate=True)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
