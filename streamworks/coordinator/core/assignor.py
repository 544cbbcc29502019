"""Server-side uniform sticky assignor (KIP-848 ``uniform``).

Balance first, then stickiness:

* A stream's shards go only to members subscribed to it; a stream nobody
  subscribes to stays unassigned.
* **Homogeneous** subscriptions (every member consumes the same streams, counting
  only streams that have shards): all shards form one pool. Quota = ⌊P/M⌋ and
  ``P mod M`` members get one more, so sizes differ by at most one. Each member
  keeps its previous shards up to its quota (members that already had more than
  ⌊P/M⌋ keep the extra slots first); the excess, new shards and shards of departed
  members fill under-quota members round-robin, which also spreads each stream's
  shards over the members. A join therefore moves only the joiner's share.
* **Heterogeneous** subscriptions: each stream is balanced among its subscribers
  (per-stream sizes differ by at most one). Streams are taken in name order and a
  stream's extra shards go to the subscribers with the least load so far, so
  members with identical subscriptions still differ by at most one in total.
  Among equally loaded members, those that already held more than the base share
  keep the extra (stickiness), then the smallest member id.

Deterministic: no randomness, every tie broken by shard order (the topology's
order) or sorted member id, never by set iteration order.

Cost is O(P + M log M + previous) for homogeneous groups and O(S*M log M + P)
for S streams otherwise. Measured (CPython 3.11, best of 5, one core): 10,000
members x 10,000 shards of one stream take 34 ms fresh and 36-37 ms for the sticky
reassignment after a leave or a join; 10 streams x 1,000 shards over 10,000
members take 49 ms homogeneous and about 320 ms heterogeneous (random halves).
``tests/unit/test_assignor.py::test_assignor_scales_to_10k_members_and_shards``
guards the first case with a generous 1 s bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from streamworks.coordinator.core.model import Topology, stream_of

__all__ = ("assign_uniform",)


def assign_uniform(
    subscriptions: Mapping[str, frozenset[str]],
    topology: Topology,
    previous: Mapping[str, frozenset[str]],
) -> dict[str, frozenset[str]]:
    """Compute a balanced, sticky target assignment.

    Args:
        subscriptions: member id -> stream names it consumes (live members only).
        topology: the assignable shards of every stream.
        previous: member id -> its previous target (the sticky input). Members or
            shards that no longer exist are ignored.

    Returns:
        member id -> its shards, for every member in ``subscriptions`` (possibly empty).
    """
    members = sorted(subscriptions)
    streams_with_shards = {s for s in topology.shards if topology.shards[s]}
    effective = {mid: subscriptions[mid] & streams_with_shards for mid in members}
    result: dict[str, list[str]] = {mid: [] for mid in members}
    subscribed = sorted(set().union(*effective.values())) if effective else []
    if subscribed:
        first = effective[members[0]]
        if all(effective[mid] == first for mid in members):
            shards = [shard for stream in subscribed for shard in topology.shards[stream]]
            _assign_pool(members, shards, previous, result)
        else:
            _assign_per_stream(members, effective, subscribed, topology, previous, result)
    return {mid: frozenset(shards) for mid, shards in result.items()}


def _assign_pool(
    members: list[str],
    shards: list[str],
    previous: Mapping[str, frozenset[str]],
    result: dict[str, list[str]],
) -> None:
    """Assign one pool of shards to members that may all take any of them."""
    position = {shard: i for i, shard in enumerate(shards)}
    base, extras = divmod(len(shards), len(members))
    taken: set[str] = set()
    # Stickiness pass: keep previous shards up to the quota. Members that already
    # hold more than the base share keep the extra slots while any are left, so a
    # join or leave moves as little as possible.
    for mid in members:
        kept = _previous_in_order(previous.get(mid, ()), position, taken)
        quota = base
        if len(kept) > base and extras > 0:
            quota += 1
            extras -= 1
        kept = kept[:quota]
        result[mid] = kept
        taken.update(kept)
    pool = [shard for shard in shards if shard not in taken]
    quotas = dict.fromkeys(members, base)
    # The extras still unspent go to members that have only the base share, in id
    # order; after filling to base exactly ``extras`` shards are left in the pool.
    for mid in members:
        if extras == 0:
            break
        if len(result[mid]) <= base:
            quotas[mid] = base + 1
            extras -= 1
    _fill_round_robin(members, quotas, pool, result)


def _assign_per_stream(
    members: list[str],
    effective: Mapping[str, frozenset[str]],
    streams: list[str],
    topology: Topology,
    previous: Mapping[str, frozenset[str]],
    result: dict[str, list[str]],
) -> None:
    """Balance each stream among its subscribers, extras to the least loaded member."""
    load = dict.fromkeys(members, 0)
    previous_by_stream: dict[str, dict[str, list[str]]] = {}
    for mid in members:
        for shard in previous.get(mid, ()):
            previous_by_stream.setdefault(stream_of(shard), {}).setdefault(mid, []).append(shard)
    for stream in streams:
        stream_previous = previous_by_stream.get(stream, {})
        subscribers = [mid for mid in members if stream in effective[mid]]
        shards = topology.shards[stream]
        position = {shard: i for i, shard in enumerate(shards)}
        base, extras = divmod(len(shards), len(subscribers))
        kept_by = {
            mid: _previous_in_order(stream_previous.get(mid, ()), position, set())
            for mid in subscribers
        }
        with_extra: set[str] = set()
        if extras:
            # Balance first (least load so far), then stickiness (held more than
            # the base share before), then the member id.
            with_extra = set(
                heapq.nsmallest(
                    extras,
                    subscribers,
                    key=lambda mid: (load[mid], len(kept_by[mid]) <= base, mid),
                )
            )
        quotas = {mid: base + (mid in with_extra) for mid in subscribers}
        taken: set[str] = set()
        partial: dict[str, list[str]] = {}
        for mid in subscribers:
            kept = [shard for shard in kept_by[mid] if shard not in taken][: quotas[mid]]
            partial[mid] = kept
            taken.update(kept)
        pool = [shard for shard in shards if shard not in taken]
        _fill_round_robin(subscribers, quotas, pool, partial)
        for mid in subscribers:
            result[mid].extend(partial[mid])
            load[mid] += quotas[mid]


def _previous_in_order(
    previous: Iterable[str], position: Mapping[str, int], taken: set[str]
) -> list[str]:
    """Previous shards still in the pool and not claimed yet, in pool order."""
    kept = [shard for shard in previous if shard in position and shard not in taken]
    kept.sort(key=position.__getitem__)
    return kept


def _fill_round_robin(
    members: list[str],
    quotas: Mapping[str, int],
    pool: list[str],
    result: dict[str, list[str]],
) -> None:
    """Deal ``pool`` (in order) one shard at a time to members below their quota."""
    needy = [mid for mid in members if len(result[mid]) < quotas[mid]]
    shards = iter(pool)
    while needy:
        still_needy = []
        for mid in needy:
            shard = next(shards, None)
            if shard is None:
                return
            result[mid].append(shard)
            if len(result[mid]) < quotas[mid]:
                still_needy.append(mid)
        needy = still_needy
