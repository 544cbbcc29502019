"""Stream metadata: shard layout, routing and the topology groups are assigned from.

A stream's shards are records ``(index, incarnation, state)``. ``PROVISIONING`` shards
are being created by a scale-out: recorded (and replicated) before their keys exist,
neither routable nor assignable until the scale-out commits them ``ACTIVE``, so no
publish can land on a key the committed layout does not know. ``ACTIVE`` shards are
routable (producers write to them) and assignable; ``DRAINING`` shards are no longer
routable but still assignable, so some member reads them to the end; ``RETIRED``
shards no longer exist in Redis. Incarnations only grow, so an index re-created
after a scale-in never reuses a key that may still be draining.

Two versions move independently: ``routing_version`` when the routable set changes
(producers must refresh), ``layout_version`` when the assignable set changes (groups
must re-assign). Both are pure data; migrations (``migrations.py``) change them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from streamworks.coordinator.core.model import Topology

__all__ = (
    "ROUTING_PROTOCOL",
    "ShardRecord",
    "ShardState",
    "StreamMeta",
    "new_stream",
    "topology_of",
)

#: Routing protocol of every stream created by this version.
ROUTING_PROTOCOL = "jump-xxh64-v1"


class ShardState(StrEnum):
    PROVISIONING = "PROVISIONING"
    ACTIVE = "ACTIVE"
    DRAINING = "DRAINING"
    RETIRED = "RETIRED"


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """One shard of a stream."""

    index: int
    incarnation: int
    state: ShardState

    def shard_id(self, stream: str) -> str:
        return f"{stream}/{self.index}@{self.incarnation}"


@dataclass(frozen=True, slots=True)
class StreamMeta:
    """Everything the coordinator records about one stream.

    Attributes:
        name: the stream name.
        routing_version: grows whenever the routable shard set changes.
        layout_version: grows whenever the assignable shard set changes.
        protocol: the routing protocol (``jump-xxh64-v1``).
        shards: every shard not yet forgotten, in (index, incarnation) order.
        next_incarnation: the incarnation a newly created shard gets.
        created_ms: creation time (Redis clock).
        migration: the migration in progress, as its JSON document (``migrations.py``).
    """

    name: str
    routing_version: int
    layout_version: int
    protocol: str
    shards: tuple[ShardRecord, ...]
    next_incarnation: int
    created_ms: int
    migration: Mapping[str, Any] | None = field(default=None)

    def routable(self) -> list[ShardRecord]:
        """ACTIVE shards in index order: what producers route over."""
        return sorted((s for s in self.shards if s.state is ShardState.ACTIVE), key=_index)

    def assignable(self) -> list[ShardRecord]:
        """ACTIVE and DRAINING shards: what groups are assigned."""
        return sorted(
            (s for s in self.shards if s.state in (ShardState.ACTIVE, ShardState.DRAINING)),
            key=lambda s: (s.index, s.incarnation),
        )

    def provisioning(self) -> list[ShardRecord]:
        """Shards a scale-out recorded whose keys may not exist yet."""
        return [s for s in self.shards if s.state is ShardState.PROVISIONING]

    @property
    def shard_count(self) -> int:
        return len(self.routable())

    def shard_ids(self, records: Iterable[ShardRecord] | None = None) -> list[str]:
        return [s.shard_id(self.name) for s in (self.shards if records is None else records)]

    def with_shards(self, shards: Iterable[ShardRecord], **changes: Any) -> StreamMeta:
        return replace(
            self, shards=tuple(sorted(shards, key=lambda s: (s.index, s.incarnation))), **changes
        )

    # -- persistence -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "routing_version": self.routing_version,
            "layout_version": self.layout_version,
            "protocol": self.protocol,
            "shards": [[s.index, s.incarnation, s.state.value] for s in self.shards],
            "next_incarnation": self.next_incarnation,
            "created_ms": self.created_ms,
            "migration": dict(self.migration) if self.migration is not None else None,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> StreamMeta:
        """Decode a stored document; raise ValueError when it is not exactly right."""
        if not isinstance(doc, dict):
            raise ValueError("stream metadata must be an object")
        try:
            shards = tuple(
                ShardRecord(int(i), int(inc), ShardState(state)) for i, inc, state in doc["shards"]
            )
            migration = doc.get("migration")
            if migration is not None and not isinstance(migration, dict):
                raise ValueError("migration must be an object")
            meta = cls(
                name=str(doc["name"]),
                routing_version=int(doc["routing_version"]),
                layout_version=int(doc["layout_version"]),
                protocol=str(doc["protocol"]),
                shards=shards,
                next_incarnation=int(doc["next_incarnation"]),
                created_ms=int(doc["created_ms"]),
                migration=MappingProxyType(migration) if migration is not None else None,
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed stream metadata: {e!r}") from e
        if any(s.incarnation >= meta.next_incarnation for s in shards):
            raise ValueError("stream metadata: a shard's incarnation is not below next_incarnation")
        return meta


def _index(record: ShardRecord) -> int:
    return record.index


def new_stream(name: str, shards: int, now_ms: int, *, first_incarnation: int = 0) -> StreamMeta:
    """Metadata of a new stream with ``shards`` ACTIVE shards."""
    if shards < 0:
        raise ValueError("shards must be >= 0")
    records = tuple(ShardRecord(i, first_incarnation, ShardState.ACTIVE) for i in range(shards))
    return StreamMeta(
        name=name,
        routing_version=1,
        layout_version=1,
        protocol=ROUTING_PROTOCOL,
        shards=records,
        next_incarnation=first_incarnation + 1,
        created_ms=now_ms,
    )


def topology_of(streams: Mapping[str, StreamMeta]) -> Topology:
    """The group core's view of some streams: assignable shards and layout versions."""
    return Topology(
        shards={name: tuple(meta.shard_ids(meta.assignable())) for name, meta in streams.items()},
        versions={name: meta.layout_version for name, meta in streams.items()},
    )
