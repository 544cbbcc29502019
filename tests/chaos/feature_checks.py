"""The chaos checks of delayed messages and schedules (issue 21): none lost, none
early, no tick twice, no tick missing.

The harness's producers publish a share of their events with ``delay=`` (up to a few
seconds) and keep each one's ``Published.due_ms`` in the ledger (:attr:`Acked.due_ms`);
the chaos app's handler adds to the start record of a delayed message its wall-clock
entry time (``w``, ``time.time()``) and the message's own due time (``d``,
``Message.due_at``). The chaos app also runs a schedule (every second, ``catch_up="all"``)
publishing to its own stream, which nobody consumes: the harness reads it back.

Delayed messages (:func:`check_delays`):

* **none lost**: every acked delayed publish was handled to the end or dead-lettered;
* **none early**: every handler run of a delayed message started at or after its due
  time, within :data:`CLOCK_TOLERANCE_MS` — Redis and the workers run on one host and
  read one clock (``CLOCK_REALTIME``: Redis ``TIME``, Python ``time.time()``); the
  tolerance is only the millisecond rounding of Redis' ``TIME`` in the move script —
  and its stream entry's id (the Redis clock when the owner moved it) is not before
  its due time either (no tolerance: one clock);
* **entered once**: no delayed event id has two entries on one shard (a move is one
  script: the entry is added and the delayed copy removed together) — unless a Redis
  failover (``redis-failover``, ``--replica``) came between them: it may lose a move
  whose entry was already handled, and the next owner moves the message again
  (docs/delays.md, Failures); those are counted apart;
* **nothing left behind** (:func:`leftover_delayed_keys`): at the end, no delayed
  message waits in any shard, and a shard retired by a scale-in took all its delayed
  keys with it.

Schedules (:func:`check_ticks`), per schedule, from the event ids of the target
stream's entries (``sw-tick:<group>:<schedule>:<tick_ms>``): **no tick twice**, **no
gap** between the first and the last tick, **none early** (the entry's id, the Redis
clock at its publish, is not before the tick's time), and the schedule still ticked
after the faults were healed (its last tick is not older than that).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from tests.chaos.checker import Acked, DeadLetter, Run

#: How far before its due time a delayed message's run may *appear* to start: the
#: move script reads Redis ``TIME`` truncated to the millisecond, the handler
#: ``time.time()`` (same host, same clock).
CLOCK_TOLERANCE_MS = 1.0
#: The chaos app's schedule period.
TICK_MS = 1000


@dataclass(frozen=True)
class DelayedStart:
    """A handler run of a delayed message, as its start record has it."""

    id: str
    group: str
    shard: str
    entry: str
    wall_ms: float  # time.time() at the handler's entry, ms
    due_ms: int  # Message.due_at: the due time stored with the message


@dataclass(frozen=True)
class TickEntry:
    """One entry of a schedule's target stream."""

    event_id: str  # sw-tick:<group>:<schedule>:<tick_ms>
    shard: str
    entry: str

    @property
    def schedule(self) -> str:
        return self.event_id.rsplit(":", 1)[0]

    @property
    def tick_ms(self) -> int:
        return int(self.event_id.rsplit(":", 1)[1])


@dataclass
class FeatureReport:
    """What the delayed-message and schedule checks found; :attr:`ok` when they hold."""

    delayed: int = 0  # acked delayed publishes
    delayed_handled: int = 0
    delayed_dead_lettered: int = 0
    delayed_runs: int = 0
    delayed_lost: list[str] = field(default_factory=list)
    early_runs: list[str] = field(default_factory=list)
    early_entries: list[str] = field(default_factory=list)
    due_mismatch: list[str] = field(default_factory=list)
    delayed_entered_twice: list[str] = field(default_factory=list)
    lateness_ms: list[float] = field(default_factory=list)  # due -> first run's start
    leftover_keys: list[str] = field(default_factory=list)
    delayed_on_retired: int = 0  # stored on a shard a scale-in retired by the end
    moved_again_after_failover: list[str] = field(default_factory=list)  # not failing
    schedules: int = 0
    ticks: int = 0
    duplicate_ticks: list[str] = field(default_factory=list)
    tick_gaps: list[str] = field(default_factory=list)
    early_ticks: list[str] = field(default_factory=list)
    stale_schedules: list[str] = field(default_factory=list)
    tick_lateness_ms: list[int] = field(default_factory=list)  # tick -> entry id

    def _violations(self) -> list[tuple[str, list[str]]]:
        return [
            ("delayed messages lost", self.delayed_lost),
            ("delayed messages handled before due", self.early_runs),
            ("delayed messages in the stream before due", self.early_entries),
            ("delayed messages whose due time differs from the publish's", self.due_mismatch),
            ("delayed messages entered twice on one shard", self.delayed_entered_twice),
            ("delayed keys left behind", self.leftover_keys),
            ("ticks published twice", self.duplicate_ticks),
            ("ticks missing (gaps)", self.tick_gaps),
            ("ticks published before their time", self.early_ticks),
            ("schedules that stopped ticking", self.stale_schedules),
        ]

    @property
    def ok(self) -> bool:
        return not any(items for _, items in self._violations())

    def failures(self) -> list[str]:
        return [
            f"{name}: {len(items)}, e.g. " + "; ".join(items[:5])
            for name, items in self._violations()
            if items
        ]

    def rows(self) -> list[tuple[str, str]]:
        """Rows of the chaos table."""
        return [
            (
                "delayed messages (acked) / handled / dead-lettered",
                f"{self.delayed} / {self.delayed_handled} / {self.delayed_dead_lettered}",
            ),
            ("**delayed messages lost**", f"**{len(self.delayed_lost)}**"),
            (
                f"**delayed runs started before due** (of {self.delayed_runs}; "
                f"tolerance {CLOCK_TOLERANCE_MS:g} ms) / entries before due",
                f"**{len(self.early_runs)}** / {len(self.early_entries)}",
            ),
            ("  due -> first run p50 / p99 / max (ms)", _spread(self.lateness_ms)),
            (
                "delayed entered twice on a shard / delayed keys left behind",
                f"{len(self.delayed_entered_twice)} / {len(self.leftover_keys)}",
            ),
            ("  delayed stored on a shard retired by a scale-in", str(self.delayed_on_retired)),
            (
                "  moved again after a Redis failover lost the move",
                str(len(self.moved_again_after_failover)),
            ),
            ("schedule ticks in the target stream (schedules)", f"{self.ticks} ({self.schedules})"),
            (
                "**ticks twice / missing / early**",
                f"**{len(self.duplicate_ticks)} / {len(self.tick_gaps)} / "
                f"{len(self.early_ticks)}**",
            ),
            ("  tick -> entry p50 / p99 / max (ms)", _spread(self.tick_lateness_ms)),
        ]

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: items[:100] for name, items in self._violations()}
        out.update(
            delayed=self.delayed,
            delayed_handled=self.delayed_handled,
            delayed_runs=self.delayed_runs,
            delayed_on_retired=self.delayed_on_retired,
            lateness_ms=_spread(self.lateness_ms),
            ticks=self.ticks,
            schedules=self.schedules,
            tick_lateness_ms=_spread(self.tick_lateness_ms),
        )
        return out


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{statistics.median(ordered):.0f} / {p99:.0f} / {ordered[-1]:.0f}"


def _entry_ms(entry: str) -> int:
    return int(entry.partition("-")[0])


def delayed_starts(lines: Iterable[bytes | str]) -> list[DelayedStart]:
    """The start records of delayed messages among the chaos app's log lines
    (``json|seq|fence``; those with a due time ``d``)."""
    out: list[DelayedStart] = []
    for line in lines:
        text = line.decode() if isinstance(line, bytes) else line
        body = text.rsplit("|", 2)[0]
        if '"d":' not in body:
            continue
        record = orjson.loads(body)
        if record.get("ev") != "start" or record.get("d") is None:
            continue
        out.append(
            DelayedStart(
                record["i"],
                record.get("g", "chaos"),
                record["s"],
                record["e"],
                float(record["w"]) * 1000,
                int(record["d"]),
            )
        )
    return out


def check_delays(
    report: FeatureReport,
    runs: Sequence[Run],
    acked: Sequence[Acked],
    dead: Sequence[DeadLetter],
    starts: Sequence[DelayedStart],
    *,
    main_group: str = "chaos",
    failovers_ms: Sequence[tuple[float, float]] = (),
) -> None:
    """Delayed messages: none lost (main group), none early, none entered twice
    (every group's runs) unless a failover window (wall-clock ms) came between."""
    delayed = {a.id: a for a in acked if a.due_ms is not None}
    report.delayed = len(delayed)
    handled = {r.id for r in runs if r.done and r.group == main_group}
    dead_ids = {d.id for d in dead if d.group == main_group}
    report.delayed_handled = len(handled & delayed.keys())
    report.delayed_dead_lettered = len((dead_ids - handled) & delayed.keys())
    for a in delayed.values():
        if a.id not in handled and a.id not in dead_ids:
            report.delayed_lost.append(f"{a.id} (stored on {a.shard}, due {a.due_ms})")
    first: dict[str, float] = {}  # event id -> due -> its first run's start (ms)
    for s in starts:
        a = delayed.get(s.id)
        report.delayed_runs += 1
        if s.wall_ms < s.due_ms - CLOCK_TOLERANCE_MS:
            report.early_runs.append(
                f"{s.id} run started {s.due_ms - s.wall_ms:.1f} ms before due ({s.group} "
                f"{s.shard} {s.entry})"
            )
        if _entry_ms(s.entry) < s.due_ms:
            report.early_entries.append(f"{s.id} entry {s.entry} on {s.shard} due {s.due_ms}")
        # A publish retried after an unknown outcome may have stored two copies (on two
        # shards after a resharding, E18), each with its own due time: only a publish
        # that was not retried must match the ledger exactly.
        if a is not None and not a.retried and a.shard == s.shard and s.due_ms != a.due_ms:
            report.due_mismatch.append(f"{s.id}: message due {s.due_ms}, published {a.due_ms}")
        if s.group == main_group:
            late = s.wall_ms - s.due_ms
            first[s.id] = min(first.get(s.id, late), late)
    report.early_entries = sorted(set(report.early_entries))
    report.lateness_ms = [late for i, late in first.items() if i in delayed]
    entries: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for r in runs:
        if r.id in delayed:
            entries[r.id].add((r.shard, r.entry))
    for d in dead:
        if d.id in delayed:
            entries[d.id].add((d.shard, d.entry))
    for event_id, found in entries.items():
        by_shard: dict[str, list[int]] = defaultdict(list)
        for shard, entry in found:
            by_shard[shard].append(_entry_ms(entry))
        for times in by_shard.values():
            if len(times) < 2:
                continue
            first, last = min(times), max(times)
            if any(start <= last and end >= first for start, end in failovers_ms):
                report.moved_again_after_failover.append(f"{event_id}: {sorted(found)}")
            else:
                report.delayed_entered_twice.append(f"{event_id}: {sorted(found)}")


def check_ticks(
    report: FeatureReport, entries: Sequence[TickEntry], *, healed_ms: int | None = None
) -> None:
    """Per schedule: no tick twice, no gap, none early; ticking after ``healed_ms``
    (wall clock ms, when the faults were over) when given."""
    by_schedule: dict[str, list[TickEntry]] = defaultdict(list)
    for e in entries:
        by_schedule[e.schedule].append(e)
    report.schedules = len(by_schedule)
    report.ticks = len(entries)
    for schedule, found in sorted(by_schedule.items()):
        counts = Counter(e.tick_ms for e in found)
        report.duplicate_ticks += [
            f"{schedule}:{tick} x{n}: "
            + ", ".join(f"{e.shard} {e.entry}" for e in found if e.tick_ms == tick)
            for tick, n in sorted(counts.items())
            if n > 1
        ]
        ticks = sorted(counts)
        for before, after in pairwise(ticks):
            if after - before != TICK_MS:
                missing = (after - before) // TICK_MS - 1
                report.tick_gaps.append(f"{schedule}: {missing} tick(s) after {before}")
        for e in found:
            late = _entry_ms(e.entry) - e.tick_ms
            if late < 0:
                report.early_ticks.append(f"{e.event_id} entered {e.entry} on {e.shard}")
            report.tick_lateness_ms.append(late)
        if healed_ms is not None and ticks[-1] < healed_ms - TICK_MS:
            report.stale_schedules.append(
                f"{schedule}: last tick {ticks[-1]}, faults healed at {healed_ms}"
            )
    if healed_ms is not None and not by_schedule:
        report.stale_schedules.append("no schedule published any tick")


async def read_ticks(redis: Any, prefix: str, shards: Iterable[str]) -> list[TickEntry]:
    """Every entry of the target stream's shards (``"stream/0@0"``, ...), by event id."""
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace

    keyspace = Keyspace(prefix)
    out: list[TickEntry] = []
    for shard in shards:
        for entry_id, fields in await redis.xrange(keyspace.stream(ShardId.parse(shard))):
            entry = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            out.append(TickEntry(fields[b"e"].decode(), shard, entry))
    return out


async def leftover_delayed_keys(
    redis: Any, prefix: str, stream: str, active: Iterable[str]
) -> list[str]:
    """Delayed-message keys that should not exist at the end: a delayed set or its
    entries on any shard (everything was due and handled by then), or any delayed key
    of a shard that is not active any more (retired by a scale-in)."""
    active_tags = {f"{{{prefix}:{shard}}}" for shard in active}
    out: list[str] = []
    async for raw in redis.scan_iter(match=f"{{{prefix}:{stream}/*}}:delayed*", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else raw
        tag, _, suffix = key.partition("}:")
        if tag + "}" not in active_tags:
            out.append(f"{key} (shard retired)")
        elif suffix in ("delayed", "delayed:entries"):
            out.append(f"{key} (still holds delayed messages)")
    return sorted(out)
