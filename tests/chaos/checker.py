"""The chaos checker: what the handlers recorded, set against what was published.

Inputs (all plain data, so the checker is tested on its own in ``test_checker.py``):

* the processing log the chaos app wrote (:func:`parse_log` → :class:`Run` per handler
  run: member, pid, shard, entry id, event id, key, attempt, the shard's owner fence as
  read atomically at the start, entry time, and how it ended);
* the producers' ledger: every *acked publish* (``publish`` returned) with the shard
  and entry id it was written to, and which publishes were retried after an error;
* the dead-letter stream's entries;
* the faults the harness injected, with their targets (pids) and time windows on the
  system's monotonic clock — the same clock the handler's entry time uses.

Checks, each with its figures:

(a) **no loss** — every acked event id was handled to the end at least once or
    dead-lettered, and so was every entry a publish reported.
(b) **no overlapping ownership** — no handler started while its shard's owner fence
    named another member (or none). The one documented exception: a process frozen by
    SIGSTOP resumes in the middle of what it was doing, so handlers it had already
    entered before the freeze, and at most the single first handler entered right
    after the resume, may read a fence that moved on meanwhile; those are excused and
    counted. Also: the fence epochs read on a shard never go backwards.
(c) **per-key order** — within one ownership period (same shard, same fence token,
    read by its owner), the first runs of the entries of one partition key start in
    entry-id order (re-runs of an entry — retries and redeliveries — are excluded), and
    no two runs of one key overlap (a run of a later entry never starts before a run
    of an earlier one ended).
(d) **duplicates** — an entry that ran again after a run that completed is a duplicate
    processing, classified by what happened to the member of the completed run
    between its end and the re-run (killed, paused, SIGTERMed, its Redis path cut,
    Redis restarted, its coordinator path cut …); an event id written to two entries
    is a duplicate write (a publish retried after an unknown outcome that landed on
    another shard: idempotent publish is per shard, E18).
(e) **delayed messages and schedules** — none lost, none early, no tick twice or
    missing: ``feature_checks.py`` (its report is :attr:`CheckReport.features`).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.chaos.feature_checks import DelayedStart, FeatureReport, check_delays

__all__ = (
    "Acked",
    "CheckReport",
    "DeadLetter",
    "FaultWindow",
    "Run",
    "check",
    "parse_log",
)

#: How long before a SIGSTOP a handler may have been entered and still be "in flight"
#: at the freeze (handlers here take at most tens of milliseconds plus two Redis
#: round trips; generous).
IN_FLIGHT_BEFORE_PAUSE = 10.0
#: How soon after a SIGCONT the one handler whose step was frozen is entered.
FIRST_AFTER_RESUME = 1.0


@dataclass
class Run:
    """One run of the handler on one entry by one member."""

    seq: int  # sequence number of its start record (unique, totally ordered)
    member: str
    pid: int
    shard: str
    entry: str
    id: str  # event id
    key: str | None
    attempt: int
    fence: str  # the shard's owner fence at the start: "<epoch>:<member>" or ""
    entered: float  # monotonic time the handler was entered
    end_seq: int | None = None  # completed (the ack follows)
    end_t: float | None = None
    fail_seq: int | None = None  # failed on purpose (flaky/poison)
    fail_t: float | None = None
    exit_seq: int | None = None  # ended otherwise (cancelled at a deadline, an error)
    exit_t: float | None = None
    late: bool = False  # its end record was written by a later run (Redis was cut)
    local_end: bool = False  # its end is known only from its worker's local file
    group: str = "chaos"
    token: int = -1  # ctx.fencing_token of the run (-1: an older log without it)

    @property
    def fence_member(self) -> str:
        return self.fence.partition(":")[2]

    @property
    def fence_epoch(self) -> int:
        head = self.fence.partition(":")[0]
        return int(head) if head.isdigit() else -1

    @property
    def done(self) -> bool:
        return self.end_seq is not None

    @property
    def closed_seq(self) -> int | None:
        """Sequence number at which the run is known to have ended (either way); None
        when unknown or when its end record was written late (the number is then later
        than the end)."""
        if self.late:
            return None
        for seq in (self.end_seq, self.fail_seq, self.exit_seq):
            if seq is not None:
                return seq
        return None

    @property
    def closed_t(self) -> float | None:
        """When the run ended (its own clock reading), if it recorded it."""
        for t in (self.end_t, self.fail_t, self.exit_t):
            if t is not None:
                return t
        return None

    def __str__(self) -> str:
        how = "ok" if self.done else "failed" if self.fail_seq is not None else "interrupted"
        return (
            f"{self.id} {self.shard} {self.entry} key={self.key} attempt={self.attempt} "
            f"by {self.member[:8]} (pid {self.pid}) seq {self.seq}-{self.closed_seq} {how}, "
            f"fence {self.fence or '(none)'}"
        )


#: The fence of a run that could not read it (``--replica``: the fence is read from
#: Redis before the record is written to the log's own server); the run raised at once.
UNREAD_FENCE = "?"


def parse_log(lines: Iterable[bytes | str], local_ends: Iterable[bytes | str] = ()) -> list[Run]:
    """Runs from the chaos app's log lines (``json|seq|fence``), in start order.
    Lines whose start record is missing (never the case unless the log was cut) are
    ignored.

    ``local_ends``: the end records the workers appended to their own files (JSON, one
    per line). They give the end of a run whose end record never reached Redis (its
    process was SIGKILLed while the record was buffered or in flight); such a run is
    marked :attr:`Run.local_end` and ``late`` (its end has no place in the sequence)."""
    runs: dict[int, Run] = {}
    by_id: dict[str, int] = {}  # run id ("r") -> seq of its start record
    closes: list[tuple[dict[str, Any], int]] = []
    for line in lines:
        text = line.decode() if isinstance(line, bytes) else line
        body, seq_text, fence = text.rsplit("|", 2)
        record = orjson.loads(body)
        seq = int(seq_text)
        if record["ev"] == "start":
            runs[seq] = Run(
                seq,
                record["m"],
                int(record["p"]),
                record["s"],
                record["e"],
                record["i"],
                record.get("k"),
                int(record["a"]),
                fence,
                float(record["t"]),
                group=record.get("g", "chaos"),
                token=int(record.get("f", -1)),
            )
            if "r" in record:
                by_id[record["r"]] = seq
        else:
            closes.append((record, seq))
    for record, seq in closes:
        # End records name their run by id ("r"); older logs by the start's seq.
        start = by_id.get(record["r"], -1) if "r" in record else int(record["start"])
        run = runs.get(start)
        if run is None:
            continue
        if run.closed_t is not None:
            continue  # (never: one end record per run)
        t = float(record["t"])
        run.late = bool(record.get("late"))
        if record["ev"] == "end":
            run.end_seq, run.end_t = seq, t
        elif record["ev"] == "fail":
            run.fail_seq, run.fail_t = seq, t
        else:
            run.exit_seq, run.exit_t = seq, t
    for line in local_ends:
        text = line.decode() if isinstance(line, bytes) else line
        if not text.strip():
            continue
        try:
            record = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue  # a torn last line (the write that the SIGKILL cut short)
        found = runs.get(by_id.get(record.get("r", ""), -1))
        if found is None or found.closed_t is not None:
            continue  # Redis has it (the usual case)
        t = float(record["t"])
        found.late = found.local_end = True
        # Seq 0: known to have ended, not where in the sequence (``closed_seq`` is None).
        if record["ev"] == "end":
            found.end_seq, found.end_t = 0, t
        elif record["ev"] == "fail":
            found.fail_seq, found.fail_t = 0, t
        else:
            found.exit_seq, found.exit_t = 0, t
    return sorted(runs.values(), key=lambda r: r.seq)


@dataclass(frozen=True)
class Acked:
    """A publish that returned: where the producer says the event was written."""

    id: str
    key: str | None
    shard: str
    entry: str
    duplicate: bool = False  # shard-level dedup found it already written
    retried: bool = False  # an earlier attempt of this publish raised
    poison: bool = False  # the message asks to fail on every attempt
    t: float = 0.0  # monotonic time its first publish attempt began
    due_ms: int | None = None  # a delayed publish: its due time (Redis clock); entry ''


@dataclass(frozen=True)
class DeadLetter:
    id: str
    shard: str
    entry: str
    reason: str
    attempts: int
    group: str = "chaos"


@dataclass(frozen=True)
class Subscription:
    """A period in which a group other than the main one was subscribed: every acked
    publish *begun* in ``[since, until)`` (monotonic clock) must have been handled to
    the end by the group (or dead-lettered by it). ``since`` is when the harness saw
    the group's members stable (its consumer groups exist: nothing published later can
    be trimmed before the group reads it)."""

    group: str
    since: float
    until: float = float("inf")


@dataclass(frozen=True)
class FaultWindow:
    """A fault as injected: its kind, the pids it hit (empty: every process, or none),
    and its window on the monotonic clock. For ``worker-pause`` the window is
    SIGSTOP → SIGCONT; for a kill or SIGTERM it starts at the signal."""

    kind: str
    target: str
    start: float
    end: float
    pids: tuple[int, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class CheckReport:
    """Everything the checker found; :attr:`ok` when (a), (b) and (c) hold."""

    runs: int = 0
    entries: int = 0
    acked: int = 0
    handled_ids: int = 0
    lost: list[str] = field(default_factory=list)
    lost_entries: list[str] = field(default_factory=list)
    dead_lettered: int = 0
    dead_lettered_poison: int = 0
    dead_lettered_other: list[str] = field(default_factory=list)
    overlap_violations: list[str] = field(default_factory=list)
    run_overlaps: list[str] = field(default_factory=list)  # run intervals of two members
    intervals_checked: int = 0
    unbounded_runs: int = 0  # no end record, process not seen dying: end = run's end
    excused_paused_runs: int = 0  # a run its own process's SIGSTOP froze
    group_lost: dict[str, list[str]] = field(default_factory=dict)
    group_checked: dict[str, int] = field(default_factory=dict)
    excused_in_flight: int = 0  # entered before a SIGSTOP, fence read after it moved
    excused_first_after_resume: int = 0
    fence_regressions: list[str] = field(default_factory=list)
    unread_fences: int = 0  # runs whose fence read failed (--replica): they raised at once
    token_decreases: list[str] = field(default_factory=list)  # ctx.fencing_token went down
    tokens_checked: int = 0
    order_violations: list[str] = field(default_factory=list)
    overlap_in_key: list[str] = field(default_factory=list)
    periods: int = 0
    duplicate_runs: Counter[str] = field(default_factory=Counter)
    duplicate_examples: dict[str, str] = field(default_factory=dict)
    reruns_after_interrupt: Counter[str] = field(default_factory=Counter)
    rerun_examples: dict[str, str] = field(default_factory=dict)
    duplicate_writes: Counter[str] = field(default_factory=Counter)
    duplicate_write_examples: dict[str, str] = field(default_factory=dict)
    failed_on_purpose: int = 0
    interrupted: int = 0
    local_ends: int = 0  # runs whose end came from the worker's local file only
    anomalies: list[str] = field(default_factory=list)  # reported, not failing
    features: FeatureReport = field(default_factory=FeatureReport)  # delays, schedules

    @property
    def ok(self) -> bool:
        return self.features.ok and not (
            self.lost
            or self.lost_entries
            or self.overlap_violations
            or self.run_overlaps
            or any(self.group_lost.values())
            or self.fence_regressions
            or self.token_decreases
            or self.order_violations
            or self.overlap_in_key
        )

    def failures(self) -> list[str]:
        out: list[str] = []
        for name, items in (
            ("lost event ids", self.lost),
            ("lost entries", self.lost_entries),
            ("overlapping ownership", self.overlap_violations),
            ("overlapping runs of two members", self.run_overlaps),
            *((f"lost by group {g}", lost) for g, lost in self.group_lost.items()),
            ("fence regressions", self.fence_regressions),
            ("fencing token decreases", self.token_decreases),
            ("per-key order", self.order_violations),
            ("overlapping runs of one key", self.overlap_in_key),
        ):
            if items:
                out.append(f"{name}: {len(items)}, e.g. " + "; ".join(items[:5]))
        return out + self.features.failures()


def _entry_order(entry: str) -> tuple[int, int]:
    ms, _, n = entry.partition("-")
    return int(ms), int(n or 0)


def check(
    runs: Sequence[Run],
    acked: Iterable[Acked],
    dead_letters: Iterable[DeadLetter],
    faults: Sequence[FaultWindow],
    *,
    main_group: str = "chaos",
    subscriptions: Sequence[Subscription] = (),
    deaths: Mapping[int, float] | None = None,
    run_end: float | None = None,
    delayed: Sequence[DelayedStart] = (),
    wall_offset: float = 0.0,
) -> CheckReport:
    """Run checks (a)–(d) of the module docstring.

    Args:
        main_group: the group subscribed from the start (checks (a), (c), (d)).
        subscriptions: periods of the other groups (check (a) per period).
        deaths: pid -> the time its process was known dead (killed or seen exited):
            a run without an end record ended by then.
        run_end: when the run was over; a run with no end record whose process was
            never seen dying is taken to have run until then.
        delayed: the start records of delayed messages (``feature_checks.py``).
        wall_offset: wall clock minus monotonic clock (s), to set the fault windows
            against entry ids (the Redis clock).
    """
    report = CheckReport(runs=len(runs))
    acked = list(acked)
    dead = list(dead_letters)
    report.acked = len(acked)
    main = [r for r in runs if r.group == main_group]
    _check_loss(report, main, acked, [d for d in dead if d.group == main_group])
    for sub in subscriptions:
        _check_group_loss(report, sub, runs, acked, dead)
    _check_intervals(report, runs, faults, deaths or {}, run_end)
    excused = _check_ownership(report, runs, faults)
    _check_order(report, runs, excused)
    _classify_duplicates(report, runs, acked, dead, faults)
    failovers = [
        ((f.start + wall_offset) * 1000, (f.end + wall_offset) * 1000)
        for f in faults
        if f.kind == "redis-failover"
    ]
    check_delays(
        report.features, runs, acked, dead, delayed, main_group=main_group, failovers_ms=failovers
    )
    return report


# -- (a) ------------------------------------------------------------------------------------
def _check_loss(
    report: CheckReport, runs: Sequence[Run], acked: list[Acked], dead: list[DeadLetter]
) -> None:
    handled = {r.id for r in runs if r.done}
    handled_entries = {(r.shard, r.entry) for r in runs if r.done}
    report.entries = len({(r.shard, r.entry) for r in runs})
    dead_ids = {d.id for d in dead}
    dead_entries = {(d.shard, d.entry) for d in dead}
    poison = {a.id for a in acked if a.poison}
    report.handled_ids = len(handled & {a.id for a in acked})
    report.dead_lettered = len(dead)
    report.dead_lettered_poison = sum(1 for d in dead if d.id in poison)
    report.dead_lettered_other = [
        f"{d.id} {d.shard} {d.entry} ({d.reason}, {d.attempts} attempts)"
        for d in dead
        if d.id not in poison
    ]
    for a in acked:
        if a.id not in handled and a.id not in dead_ids:
            report.lost.append(f"{a.id} (published to {a.shard} {a.entry})")
        elif (
            a.entry
            and (a.shard, a.entry) not in handled_entries
            and (a.shard, a.entry) not in dead_entries
        ):
            report.lost_entries.append(f"{a.shard} {a.entry} ({a.id})")
    report.failed_on_purpose = sum(1 for r in runs if r.fail_seq is not None)
    report.interrupted = sum(1 for r in runs if r.end_seq is None and r.fail_seq is None)
    report.local_ends = sum(1 for r in runs if r.local_end)


def _check_group_loss(
    report: CheckReport,
    sub: Subscription,
    runs: Sequence[Run],
    acked: list[Acked],
    dead: list[DeadLetter],
) -> None:
    handled = {r.id for r in runs if r.done and r.group == sub.group}
    dead_ids = {d.id for d in dead if d.group == sub.group}
    due = [a for a in acked if sub.since <= a.t < sub.until]
    lost = report.group_lost.setdefault(sub.group, [])
    report.group_checked[sub.group] = report.group_checked.get(sub.group, 0) + len(due)
    for a in due:
        if a.id not in handled and a.id not in dead_ids:
            lost.append(f"{a.id} (published to {a.shard} {a.entry}, {sub.group} period)")


#: How long after a SIGCONT a run frozen by its own process's SIGSTOP may go on (it
#: resumes where it was: an async run until its next ``await``, a sync run until the
#: fail-stop) — the documented exception of docs/guarantees.md. Generous for a loaded
#: machine; a run that goes on longer is not excused.
RESUMED_RUN_SLACK = 1.5


def _check_intervals(
    report: CheckReport,
    runs: Sequence[Run],
    faults: Sequence[FaultWindow],
    deaths: Mapping[int, float],
    run_end: float | None,
) -> None:
    """(b) on run intervals: per shard and group, no run of one member (entry to end,
    whichever way it ended) overlaps a run of another member in time."""
    pauses: dict[int, list[FaultWindow]] = defaultdict(list)
    for f in faults:
        if f.kind == "worker-pause":
            for pid in f.pids:
                pauses[pid].append(f)
    horizon = run_end if run_end is not None else max((r.entered for r in runs), default=0.0)
    per: dict[tuple[str, str], list[tuple[float, float, Run]]] = defaultdict(list)
    excused: set[int] = set()
    for r in runs:
        end = r.closed_t
        if end is None:
            end = deaths.get(r.pid)
        if end is None:
            report.unbounded_runs += 1
            end = horizon
        end = max(end, r.entered)
        for w in pauses.get(r.pid, ()):
            if w.start < end and w.end > r.entered:  # frozen during the run
                if end <= w.end + RESUMED_RUN_SLACK:
                    excused.add(r.seq)
                    report.excused_paused_runs += 1
                break
        per[(r.shard, r.group)].append((r.entered, end, r))
    for (shard, group), intervals in per.items():
        intervals.sort(key=lambda x: x[0])
        report.intervals_checked += len(intervals)
        active: list[tuple[float, float, Run]] = []
        for start, end, r in intervals:
            active = [a for a in active if a[1] > start]
            for _, other_end, other in active:
                if other.member == r.member or r.seq in excused or other.seq in excused:
                    continue
                report.run_overlaps.append(
                    f"{group} {shard}: run {r} [{start:.3f}, {end:.3f}] overlaps run {other} "
                    f"[.., {other_end:.3f}] by {other_end - start:.3f}s"
                )
            active.append((start, end, r))


# -- (b) ------------------------------------------------------------------------------------
def _check_ownership(
    report: CheckReport, runs: Sequence[Run], faults: Sequence[FaultWindow]
) -> set[int]:
    """Returns the start seqs of the excused runs (left out of the order check)."""
    pauses: dict[int, list[FaultWindow]] = defaultdict(list)
    for f in faults:
        if f.kind == "worker-pause":
            for pid in f.pids:
                pauses[pid].append(f)
    # The first handler each paused pid entered after each resume.
    by_pid: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        by_pid[r.pid].append(r)
    first_after: set[int] = set()
    for pid, windows in pauses.items():
        mine = sorted(by_pid.get(pid, ()), key=lambda r: r.entered)
        times = [r.entered for r in mine]
        for w in windows:
            i = bisect.bisect_left(times, w.end)
            if i < len(mine) and mine[i].entered - w.end <= FIRST_AFTER_RESUME:
                first_after.add(mine[i].seq)

    excused: set[int] = set()
    for r in runs:
        if r.fence_member == r.member and r.fence_member:
            continue
        in_flight = any(
            w.start - IN_FLIGHT_BEFORE_PAUSE <= r.entered < w.start for w in pauses.get(r.pid, ())
        )
        if in_flight:
            report.excused_in_flight += 1
            excused.add(r.seq)
        elif r.seq in first_after:
            report.excused_first_after_resume += 1
            excused.add(r.seq)
        elif r.fence == UNREAD_FENCE:
            # Raised at once, having done nothing; its token is still checked.
            report.unread_fences += 1
        else:
            report.overlap_violations.append(str(r))

    top: dict[tuple[str, str], tuple[int, Run]] = {}
    for r in runs:
        epoch = r.fence_epoch
        if epoch < 0:
            continue
        best = top.get((r.shard, r.group))
        if best is not None and epoch < best[0]:
            report.fence_regressions.append(f"{r} after fence {best[1].fence} (seq {best[1].seq})")
        if best is None or epoch > best[0]:
            top[(r.shard, r.group)] = (epoch, r)
    _check_tokens(report, runs, excused)
    return excused


def _check_tokens(report: CheckReport, runs: Sequence[Run], excused: set[int]) -> None:
    """``ctx.fencing_token`` never goes down per shard and group: in start order, no
    run's token is below one an earlier run had. An application that fences its side
    effects with the token (keeping the highest it saw) would refuse such a run — the
    legitimate owner's, when the lower token is the newer grant. Runs the ownership
    check excused (entered by a process just before or after its own SIGSTOP: its
    token is that of a grant it lost while frozen, and the runtime stops it at once)
    are not held against the newer owner's."""
    top: dict[tuple[str, str], Run] = {}
    for r in runs:  # start order (the log's sequence)
        if r.token < 0:
            continue
        report.tokens_checked += 1
        best = top.get((r.shard, r.group))
        if best is not None and r.token < best.token and r.seq not in excused:
            report.token_decreases.append(
                f"{r} token {r.token} after {best.token} (seq {best.seq})"
            )
        if best is None or r.token > best.token:
            top[(r.shard, r.group)] = r


# -- (c) ------------------------------------------------------------------------------------
def _check_order(report: CheckReport, runs: Sequence[Run], excused: set[int]) -> None:
    seen_entries: set[tuple[str, str]] = set()
    first_run: set[int] = set()
    for r in runs:  # in start order
        e = (r.shard, r.entry)
        if e not in seen_entries:
            seen_entries.add(e)
            first_run.add(r.seq)
    periods: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in runs:
        if r.fence_member == r.member and r.seq not in excused:
            periods[(r.shard, r.group + "/" + r.fence)].append(r)
    report.periods = len(periods)
    for (shard, fence), members in periods.items():
        by_key: dict[str, list[Run]] = defaultdict(list)
        for r in members:
            if r.key is not None:
                by_key[r.key].append(r)
        for key, key_runs in by_key.items():
            # Start order of first runs follows entry order.
            last: Run | None = None
            for r in key_runs:
                if r.seq not in first_run:
                    continue
                if last is not None and _entry_order(r.entry) < _entry_order(last.entry):
                    report.order_violations.append(
                        f"key {key} on {shard} (fence {fence}): {r.entry} started (seq {r.seq}) "
                        f"after {last.entry} (seq {last.seq})"
                    )
                if last is None or _entry_order(r.entry) > _entry_order(last.entry):
                    last = r
            # No two runs of the key at once (runs whose end is unknown are skipped).
            running: list[Run] = []
            for r in key_runs:  # start order
                running = [o for o in running if (o.closed_seq or 0) > r.seq]
                for other in running:
                    if other.entry != r.entry:
                        report.overlap_in_key.append(
                            f"key {key} on {shard}: {r.entry} started (seq {r.seq}) while "
                            f"{other.entry} ran (seq {other.seq}-{other.closed_seq})"
                        )
                if r.closed_seq is not None:
                    running.append(r)


# -- (d) ------------------------------------------------------------------------------------
_CAUSES = (
    # (fault kind, whose, slack, label). whose: "pid" = the fault hit the process of the
    # earlier run, "all" = it hit everyone. slack: seconds the fault's direct effects
    # outlive its window.
    ("worker-kill", "pid", 0.0, "worker SIGKILLed before its ack was flushed"),
    ("worker-pause", "pid", 0.0, "worker paused (SIGSTOP) with the message unacked"),
    ("worker-term", "pid", 0.0, "worker SIGTERMed with the message unacked"),
    ("redis-restart", "all", 5.0, "Redis restarted before the ack"),
    ("cut-redis", "pid", 5.0, "worker-Redis connection cut (ack or handler write lost)"),
    ("cut-coordinator", "pid", 2.0, "lease lost/fenced: worker cut off from the coordinators"),
    ("delay-coordinator", "pid", 2.0, "lease lost/fenced: slow coordinator path"),
    ("coordinator-kill", "all", 2.0, "coordinator replica killed (rebalance)"),
    ("coordinator-rolling", "all", 2.0, "coordinator rolling restart (rebalance)"),
    ("scale", "all", 5.0, "resharding (rebalance)"),
    ("redis-failover", "all", 5.0, "Redis failover after replication lag (acks lost)"),
    ("coordinator-pause", "all", 2.0, "coordinator replica paused mid-request (rebalance)"),
    ("http-hold", "all", 2.0, "heartbeats held (lease lost/fenced)"),
    ("http-duplicate", "all", 2.0, "heartbeats duplicated"),
    ("http-reorder", "all", 2.0, "heartbeats reordered (lease lost/fenced)"),
    ("fail-stop", "pid", 0.0, "worker fail-stopped (exit 75: a sync run outlived its lease)"),
    ("unsubscribe", "all", 2.0, "group stopped, unsubscribed and resubscribed"),
)
#: An entry run before its group's unsubscribe and again after the resubscribe at
#: ``earliest``: a re-read by design (at-least-once), checked before the faults.
RESUBSCRIBED = "group unsubscribed, then resubscribed at earliest (re-reads the stream)"
#: A Redis restart or a cut breaks every pooled connection of the worker; redis-py
#: notices only when one is next used, which for an idle connection can be minutes
#: later: that command (e.g. an ack flush) fails then, without any fault at that time.
STALE = "stale pooled connection broken by an earlier Redis restart/cut (ack failed)"


def _cause(before: Run, after: Run, faults: Sequence[FaultWindow], born: float) -> str:
    """Why ``after`` re-ran the entry ``before`` ran: the first fault (in the order of
    :data:`_CAUSES`) that hit ``before``'s process between its start and the re-run;
    else a Redis restart or cut earlier in the life of that process (``born``: its
    first handler entry), whose broken connections fail on their next use."""
    lo, hi = before.entered, after.entered
    for f in faults:
        # The group was unsubscribed and subscribed again (at ``earliest``, on purpose)
        # between the two runs: it re-reads what is still in the stream, whatever else
        # happened meanwhile.
        if f.kind == "unsubscribe" and f.target == before.group and lo < f.start <= f.end < hi:
            return RESUBSCRIBED
    for kind, whose, slack, label in _CAUSES:
        for f in faults:
            if f.kind != kind or f.end + slack < lo or f.start > hi:
                continue
            if whose == "all" or before.pid in f.pids:
                return label
    for f in faults:
        hit = f.kind == "redis-restart" or (f.kind == "cut-redis" and before.pid in f.pids)
        if hit and born - 30 <= f.end and f.start < hi:
            return STALE
    for f in faults:
        if f.kind == "delay-redis" and before.pid in f.pids and f.end + 1 >= lo and f.start <= hi:
            return "slow worker-Redis path"
    return "unexplained"


def _classify_duplicates(
    report: CheckReport,
    runs: Sequence[Run],
    acked: list[Acked],
    dead: list[DeadLetter],
    faults: Sequence[FaultWindow],
) -> None:
    by_entry: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
    born: dict[int, float] = {}
    for r in runs:
        by_entry[(r.group, r.shard, r.entry)].append(r)
        born[r.pid] = min(born.get(r.pid, r.entered), r.entered)
    for entry_runs in by_entry.values():
        completed: Run | None = None
        previous: Run | None = None
        for r in entry_runs:  # start order
            if completed is not None:
                cause = _cause(completed, r, faults, born[completed.pid])
                report.duplicate_runs[cause] += 1
                report.duplicate_examples.setdefault(cause, f"{completed}  -> re-run {r}")
            elif previous is not None and previous.fail_seq is None:
                # The previous run was interrupted (no end, no failure record): a retry.
                cause = _cause(previous, r, faults, born[previous.pid])
                report.reruns_after_interrupt[cause] += 1
                report.rerun_examples.setdefault(cause, f"{previous}  -> re-run {r}")
            if r.done and completed is None:
                completed = r
            previous = r

    # Event ids written to more than one entry.
    entries_of: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for r in runs:
        entries_of[r.id].add((r.shard, r.entry))
    for d in dead:
        entries_of[d.id].add((d.shard, d.entry))
    retried = {a.id for a in acked if a.retried}
    for event_id, entries in entries_of.items():
        if len(entries) < 2:
            continue
        shards = {s for s, _ in entries}
        if len(shards) < len(entries):
            cause = "same event id twice on one shard (shard-level dedup missed it)"
            report.anomalies.append(f"{event_id}: {sorted(entries)}")
        elif event_id in retried:
            cause = "publish retried after an unknown outcome, landed on another shard (E18)"
        else:
            cause = "written to two shards without a publish retry"
            report.anomalies.append(f"{event_id}: {sorted(entries)} (no retry recorded)")
        report.duplicate_writes[cause] += len(entries) - 1
        report.duplicate_write_examples.setdefault(cause, f"{event_id}: {sorted(entries)}")
    if report.dead_lettered_other:
        report.anomalies.extend(f"dead-lettered: {d}" for d in report.dead_lettered_other[:20])
    if report.duplicate_runs.get("unexplained"):
        report.anomalies.append(
            f"{report.duplicate_runs['unexplained']} duplicate runs with no fault to explain "
            f"them, e.g. {report.duplicate_examples['unexplained']}"
        )
