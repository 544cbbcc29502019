"""Changing a stream's shard count: the pure decisions of a migration (docs/protocol.md#migrations).

**Scale-out N → M** records shards ``N…M-1`` under a fresh incarnation as
``PROVISIONING`` (neither routable nor assignable); once that layout is committed and
on the replicas, the shell creates their keys with every registered group's consumer
group, then :func:`activate` makes them ``ACTIVE``: routing is published with ``M``
shards and the new layout makes every subscribed group re-assign. In that order, no
publish can land on a shard key the committed layout does not know, whatever a
failover loses: a lost ``ACTIVE`` commit leaves the shards ``PROVISIONING``, and any
replica finishes the scale-out (their keys exist or are created again).

**Scale-in N → M** (M may be 0) marks shards ``M…N-1`` ``DRAINING``: no longer
routable, still assignable, so their owners keep reading them. Routing is published
at once with ``M`` shards and a **routing fence** is recorded: Redis time plus the
routing lease, after which no producer can still hold the old routing. Once the fence
has passed, each draining shard is checked in Redis (``retire.lua``): every registered
group present, ``pending == 0``, ``lag == 0`` (``nil`` is *not* drained), nothing after
``last-delivered-id``; the same script deletes the key atomically when the check
passes. A retired shard leaves the layout. The migration is complete when nothing is
draining; its RETIRED records are pruned then (``next_incarnation`` keeps new keys
from ever repeating theirs).

Nothing here waits for a live member: phases advance on time and on Redis evidence
only, so a migration never sticks because nobody heartbeats (E9, E10), and "no live
owner" is never taken for "drained" (E11). Messages are never moved (E13).

A scale request while shards still drain is applied at once: the layout changes
again, new shards get a new incarnation (no key collision), and the draining set
grows (the fence moves to the later of the two). This is the documented behaviour
for overlapping requests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from enum import StrEnum
from typing import Any

from streamworks.coordinator.core.streams import ShardRecord, ShardState, StreamMeta

__all__ = (
    "MigrationPhase",
    "activate",
    "due_for_drain_check",
    "migration_phase",
    "retire_shards",
    "scale",
)


class MigrationPhase(StrEnum):
    """Where a stream's migration is (docs/protocol.md#migrations)."""

    NONE = "NONE"  # nothing draining: no migration, or the last one completed
    FENCING = "FENCING"  # draining shards exist; producers may still hold old routing
    DRAINING = "DRAINING"  # fence passed: draining shards are checked and retired


def scale(meta: StreamMeta, target: int, now_ms: int, routing_lease_ms: int) -> StreamMeta:
    """Apply a request to have ``target`` routable shards.

    Raises:
        ValueError: ``target`` is negative, or equals the current routable count.
    """
    if target < 0:
        raise ValueError("a stream cannot have a negative number of shards")
    if meta.provisioning():
        raise ValueError(f"stream {meta.name!r}: a scale-out is still being provisioned")
    active = meta.routable()
    current = len(active)
    if target == current:
        raise ValueError(f"stream {meta.name!r} already has {current} shards")
    records = list(meta.shards)
    incarnation = meta.next_incarnation
    created: list[str] = []
    draining: list[str] = []
    if target > current:
        for index in range(current, target):
            record = ShardRecord(index, incarnation, ShardState.PROVISIONING)
            records.append(record)
            created.append(record.shard_id(meta.name))
        incarnation += 1
    else:
        for record in active[target:]:
            records[records.index(record)] = replace(record, state=ShardState.DRAINING)
            draining.append(record.shard_id(meta.name))
    previous = dict(meta.migration or {})
    if "completed_ms" in previous:
        # The last migration completed: this one starts its own lists (the record
        # stays the size of one migration, not of every migration ever run).
        previous = {"id": previous.get("id", 0)}
    fence = int(previous.get("routing_fence_ms", 0))
    if draining:
        fence = max(fence, now_ms + routing_lease_ms)
    migration: dict[str, Any] = {
        "id": int(previous.get("id", 0)) + 1,
        "from": current,
        "to": target,
        "started_ms": now_ms,
        "routing_fence_ms": fence,
        "draining": sorted(set(previous.get("draining", [])) | set(draining)),
        "retired": list(previous.get("retired", [])),
        "created": created,
    }
    updated = meta.with_shards(
        records,
        next_incarnation=incarnation,
        # A scale-out changes routing (and the layout) only when it activates.
        routing_version=meta.routing_version + (0 if created else 1),
        migration=migration,
    )
    return _settle(updated)


def activate(meta: StreamMeta) -> StreamMeta:
    """Make the PROVISIONING shards ACTIVE (their keys exist now): routing and the
    layout change. No-op when none is provisioning.

    Raises:
        ValueError: a PROVISIONING shard sits at an index an ACTIVE shard holds (the
            metadata is inconsistent: never repaired by guessing).
    """
    provisioning = meta.provisioning()
    if not provisioning:
        return meta
    active = {s.index for s in meta.routable()}
    if any(s.index in active for s in provisioning):
        raise ValueError(f"stream {meta.name!r}: a provisioning shard's index is active")
    records = [
        replace(s, state=ShardState.ACTIVE) if s.state is ShardState.PROVISIONING else s
        for s in meta.shards
    ]
    return meta.with_shards(
        records,
        routing_version=meta.routing_version + 1,
        layout_version=meta.layout_version + 1,
    )


def migration_phase(meta: StreamMeta, now_ms: int) -> MigrationPhase:
    """The phase of the stream's migration at ``now_ms``."""
    if not any(s.state is ShardState.DRAINING for s in meta.shards):
        return MigrationPhase.NONE
    fence = int((meta.migration or {}).get("routing_fence_ms", 0))
    return MigrationPhase.FENCING if now_ms < fence else MigrationPhase.DRAINING


def due_for_drain_check(meta: StreamMeta, now_ms: int) -> list[ShardRecord]:
    """Draining shards to check (and retire if drained) now: all of them once the
    routing fence has passed, none before."""
    if migration_phase(meta, now_ms) is not MigrationPhase.DRAINING:
        return []
    return [s for s in meta.shards if s.state is ShardState.DRAINING]


def retire_shards(meta: StreamMeta, shard_ids: Iterable[str], now_ms: int) -> StreamMeta:
    """Record shards whose keys the drain check deleted: they leave the layout."""
    retired = set(shard_ids)
    if not retired:
        return meta
    records = []
    for record in meta.shards:
        if record.shard_id(meta.name) in retired and record.state is ShardState.DRAINING:
            record = replace(record, state=ShardState.RETIRED)
        records.append(record)
    migration = dict(meta.migration or {})
    migration["retired"] = sorted(set(migration.get("retired", [])) | retired)
    migration["draining"] = sorted(set(migration.get("draining", [])) - retired)
    updated = meta.with_shards(records, layout_version=meta.layout_version + 1, migration=migration)
    return _settle(updated, now_ms)


def _settle(meta: StreamMeta, now_ms: int | None = None) -> StreamMeta:
    """Stamp the migration record complete once nothing drains (it stays as the last
    migration, for status), and prune the RETIRED records then. The phase itself is
    never stored: it is derived from the shard states and the clock
    (:func:`migration_phase`).

    A retired record is needed only while its migration runs (it is what tells a
    drain check that found the key gone from a shard still to check). Incarnations
    never repeat without it: ``next_incarnation`` only grows and every new shard
    takes it, so a key of a pruned shard is never created again.
    """
    migration = dict(meta.migration or {})
    if not migration:
        return meta
    draining = any(s.state is ShardState.DRAINING for s in meta.shards)
    if draining:
        migration.pop("completed_ms", None)
    elif "completed_ms" not in migration:
        migration["completed_ms"] = now_ms if now_ms is not None else migration.get("started_ms")
    migration.pop("phase", None)
    shards = meta.shards
    if not draining:
        shards = tuple(s for s in shards if s.state is not ShardState.RETIRED)
    return replace(meta, shards=shards, migration=migration)
