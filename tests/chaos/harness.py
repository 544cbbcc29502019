"""The chaos harness: a whole streamworks deployment as real processes, under faults.

One :class:`ChaosRun` starts

* its own Redis (``EmbeddedRedis(appendonly=True)``: AOF with ``appendfsync always``,
  so a restart keeps every acknowledged write), on 127.0.0.1;
* two coordinator replicas (``python -m streamworks coordinator``) on fixed ports, so a
  restarted replica comes back at the same address;
* N workers of the chaos app (``tests/chaos/apps/chaosapp.py``, ``ordering="key"``),
  each reaching Redis and each replica through TCP proxies of its own
  (``tests/chaos/proxy.py``) so network faults hit one path of one worker;
* producers in this process, publishing uniquely numbered, keyed messages at a steady
  rate (through a proxy of their own to Redis), each batch retried with the *same*
  event ids until ``publish_many`` returns; only then is a message an *acked publish*;

then plays the fault schedule drawn from the seed (``tests/chaos/schedule.py``),
heals everything, lets the workers drain, and hands the processing log, the
producers' ledger, the dead letters and the injected faults to the checker
(``tests/chaos/checker.py``). Process plumbing (spawning with the test env and short
timers, log files, killing at the end) is the end-to-end harness's
:class:`~tests.e2e.harness.Cluster`. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import secrets
import select
import signal
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
from redis.exceptions import RedisError

from streamworks import App, Record
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import StatusResponse
from streamworks.redis.acl import ROLES, Role, setuser_command
from streamworks.redis.keyspace import Keyspace
from streamworks.runtime.ownership import FAIL_STOP_EXIT_CODE
from streamworks.settings import Settings
from streamworks.testing.acl import acl_log, with_credentials
from tests.chaos.apps import chaosapp
from tests.chaos.checker import (
    Acked,
    CheckReport,
    DeadLetter,
    FaultWindow,
    Subscription,
    check,
    parse_log,
)
from tests.chaos.failover import RedisPair
from tests.chaos.fault_kinds import NewFaults, http_proxy_name
from tests.chaos.feature_checks import (
    FeatureReport,
    TickEntry,
    check_ticks,
    delayed_starts,
    leftover_delayed_keys,
    read_ticks,
)
from tests.chaos.proxy import ProxyHub
from tests.chaos.schedule import Fault, format_schedule, kinds, make_schedule
from tests.chaos.servers import Servers
from tests.chaos.trace_check import check_directory, record_history
from tests.e2e.harness import FAST_TIMERS, Cluster, Proc, free_port, wait_ready, wait_until

__all__ = ("ChaosConfig", "ChaosResult", "ChaosRun", "run_chaos")

TARGET = "tests.chaos.apps.chaosapp:app"
STREAM = chaosapp.STREAM
GROUP = chaosapp.GROUP
LATE_GROUP = "chaos-late"
PREFIX = "chaos"
LEASE_TTL = float(FAST_TIMERS["STREAMWORKS_LEASE_TTL"])


@dataclass
class ChaosConfig:
    """What to run. ``command()`` is the line that replays it."""

    seed: int
    duration: float = 1800.0  # seconds of faults
    workers: int = 4
    producers: int = 2
    rate: float = 40.0  # messages per second, all producers together
    shards: int = 4  # at the start; scale faults move it within [2, 8]
    keys: int = 24  # partition keys per producer
    max_work: float = 0.02  # handler sleeps up to this long (s) ...
    long_work: float = 4.0  # ... except a share of messages, up to this long
    long_share: float = 0.01  # the share of messages with a long handler run
    sync_workers: bool = True  # odd worker slots run the plain ``def`` handler
    late_group: bool = True  # a second group subscribes mid-run, is unsubscribed, back
    flaky: float = 0.02  # share of messages failing their first attempt
    poison: float = 0.001  # share failing every attempt (-> DLQ)
    delay_share: float = 0.1  # share published with delay= (feature_checks.py) ...
    max_delay: float = 5.0  # ... of 0.2 s up to this long
    gap: tuple[float, float] = (3.0, 8.0)  # between fault starts (s)
    cover_all: bool = False  # start with one fault of every kind
    settle_timeout: float = 240.0
    workdir: Path | None = None
    progress_every: float = 30.0
    quiet: bool = False
    acl: bool = False  # every process as its role's least-privilege ACL user
    trace: bool = True  # record the protocol history and run the trace check on it
    replica: bool = False  # Redis is a primary+replica pair (redis-failover faults)

    def command(self) -> str:
        args = [
            f"--seed {self.seed}",
            f"--duration {self.duration:g}",
            f"--workers {self.workers}",
            f"--producers {self.producers}",
            f"--rate {self.rate:g}",
            f"--gap {self.gap[0]:g},{self.gap[1]:g}",
            f"--long-work {self.long_work:g}",
            f"--long-share {self.long_share:g}",
            f"--delay-share {self.delay_share:g}",
            f"--max-delay {self.max_delay:g}",
        ]
        if self.cover_all:
            args.append("--cover-all")
        if self.acl:
            args.append("--acl")
        if self.replica:
            args.append("--replica")
        return ".venv/bin/python -m tests.chaos " + " ".join(args)


@dataclass
class ChaosResult:
    config: ChaosConfig
    report: CheckReport
    published: int
    publish_attempts_failed: int
    publish_errors: Counter[str]
    publish_retried_ids: int
    publish_dedup_hits: int
    unacked: int
    faults: Counter[str]
    faults_failed: list[str]
    final_state: list[str]  # what was not drained/healthy at the end (empty: fine)
    anomalies: list[str]
    log_lines: dict[str, int]  # notable worker/coordinator log lines, counted
    start_refusals: int  # restarts refused while Redis was unreachable (then retried)
    elapsed: float
    workdir: Path
    fail_stops: int = 0
    long_runs: int = 0
    unsubscribes: int = 0
    server: str = "Redis"
    trace: tuple[bool, str] = (True, "not recorded")  # the trace check: passed, output
    fault_rows: list[tuple[str, str]] = field(default_factory=list)  # fault_kinds.py

    @property
    def ok(self) -> bool:
        return self.report.ok and not self.final_state and self.trace[0]

    def config_kinds(self) -> list[str]:
        """Every fault kind the run's schedule draws from."""
        return kinds(self.config.replica)

    def failures(self) -> list[str]:
        trace = [] if self.trace[0] else [self.trace[1]]
        return [*self.report.failures(), *self.final_state, *trace]

    def _pair_text(self) -> str:
        return ", a primary+replica pair" if self.config.replica else ""

    def table(self) -> str:
        """The figures, as a Markdown table."""
        r = self.report
        rows: list[tuple[str, str]] = [
            ("seed", str(self.config.seed)),
            ("fault phase", f"{self.config.duration:g} s (whole run {self.elapsed:.0f} s)"),
            (
                "processes",
                f"{self.server} (AOF always{self._pair_text()}), 2 coordinators, "
                f"{self.config.workers} workers "
                f"(2 of them sync) + 2 of a late group, {self.config.producers} producers",
            ),
            ("messages published (acked publishes)", str(self.published)),
            ("publish attempts that raised (retried)", str(self.publish_attempts_failed)),
            ("  their errors", _counts(self.publish_errors) or "-"),
            (
                "  retried publishes answered 'duplicate' by shard dedup",
                str(self.publish_dedup_hits),
            ),
            ("publishes never acked (given up at the end)", str(self.unacked)),
            ("faults injected", str(sum(self.faults.values()))),
        ]
        rows += [(f"  {kind}", str(self.faults.get(kind, 0))) for kind in self.config_kinds()]
        rows += self.fault_rows
        rows += [
            (
                "worker fail-stops (exit 75: a sync run outlived its lease), restarted",
                str(self.fail_stops),
            ),
            ("late group: unsubscribe + resubscribe cycles", str(self.unsubscribes)),
            (
                f"messages with a long handler run (0.2 s .. {self.config.long_work:g} s)",
                str(self.long_runs),
            ),
            ("handler runs", str(r.runs)),
            ("  failed on purpose (flaky/poison)", str(r.failed_on_purpose)),
            ("  interrupted (no end record)", str(r.interrupted)),
            ("  end known only from the worker's local file", str(r.local_ends)),
            ("acked messages handled", str(r.handled_ids)),
            (
                "dead-lettered (poison / other)",
                f"{r.dead_lettered_poison} / {len(r.dead_lettered_other)}",
            ),
            ("**messages lost**", f"**{len(r.lost) + len(r.lost_entries)}**"),
            (
                "**overlapping-ownership violations** (fence at start)",
                f"**{len(r.overlap_violations)}**",
            ),
            (
                "**overlapping runs of two members** (intervals, per shard and group)",
                f"**{len(r.run_overlaps)}**",
            ),
            (
                "  run intervals checked / end unknown (taken as the run's end)",
                f"{r.intervals_checked} / {r.unbounded_runs}",
            ),
            ("  excused: runs frozen by their own process's SIGSTOP", str(r.excused_paused_runs)),
            *(
                (
                    f"late group {g}: acked publishes due / **lost**",
                    f"{r.group_checked.get(g, 0)} / **{len(lost)}**",
                )
                for g, lost in r.group_lost.items()
            ),
            (
                "  excused: in flight at a SIGSTOP / first after SIGCONT",
                f"{r.excused_in_flight} / {r.excused_first_after_resume}",
            ),
            ("fence regressions", str(len(r.fence_regressions))),
            (
                "**fencing token decreases** (ctx.fencing_token, per shard and group)",
                f"**{len(r.token_decreases)}** of {r.tokens_checked} runs",
            ),
            (
                "**per-key order violations**",
                f"**{len(r.order_violations) + len(r.overlap_in_key)}**",
            ),
            ("  ownership periods checked", str(r.periods)),
            (
                "duplicate processings (re-run after a completed run)",
                str(sum(r.duplicate_runs.values())),
            ),
        ]
        rows += [(f"  {cause}", str(n)) for cause, n in r.duplicate_runs.most_common()]
        rows.append(
            ("duplicate writes (one event id, two entries)", str(sum(r.duplicate_writes.values())))
        )
        rows += [(f"  {cause}", str(n)) for cause, n in r.duplicate_writes.most_common()]
        rows.append(
            (
                "re-runs after an interrupted run (not duplicates)",
                str(sum(r.reruns_after_interrupt.values())),
            )
        )
        rows += [(f"  {cause}", str(n)) for cause, n in r.reruns_after_interrupt.most_common()]
        rows += r.features.rows()
        rows.append(
            (
                "final state",
                "drained, all processes healthy"
                if not self.final_state
                else "; ".join(self.final_state),
            )
        )
        logs = self.log_lines
        rows.append(
            (
                "process logs: lease losses / fenced reads / ack flushes failed / tracebacks"
                " / lag repairs (Redis < 7.4)",
                f"{logs.get('lease losses', 0)} / {logs.get('fenced reads', 0)} / "
                f"{logs.get('ack flushes failed', 0)} / {logs.get('tracebacks', 0)} / "
                f"{logs.get('lag repairs', 0)}",
            )
        )
        rows.append(("**trace check** (docs/protocol-model.md)", self.trace[1].splitlines()[0]))
        rows.append(("verdict", "PASS" if self.ok else "FAIL"))
        width = max(len(a) for a, _ in rows)
        lines = [f"| {'figure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
        lines += [f"| {a.ljust(width)} | {b} |" for a, b in rows]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        r = self.report
        return {
            "seed": self.config.seed,
            "command": self.config.command(),
            "config": {k: str(v) for k, v in asdict(self.config).items()},
            "ok": self.ok,
            "trace": self.trace[1],
            "published": self.published,
            "publish_attempts_failed": self.publish_attempts_failed,
            "publish_errors": dict(self.publish_errors),
            "publish_dedup_hits": self.publish_dedup_hits,
            "unacked": self.unacked,
            "faults": dict(self.faults),
            "faults_failed": self.faults_failed,
            "fault_rows": dict(self.fault_rows),
            "runs": r.runs,
            "handled": r.handled_ids,
            "lost": r.lost[:100],
            "lost_entries": r.lost_entries[:100],
            "dead_lettered_poison": r.dead_lettered_poison,
            "dead_lettered_other": r.dead_lettered_other[:100],
            "overlap_violations": r.overlap_violations[:100],
            "run_overlaps": r.run_overlaps[:100],
            "intervals_checked": r.intervals_checked,
            "unbounded_runs": r.unbounded_runs,
            "excused_paused_runs": r.excused_paused_runs,
            "group_lost": {g: v[:100] for g, v in r.group_lost.items()},
            "group_checked": r.group_checked,
            "fail_stops": self.fail_stops,
            "long_runs": self.long_runs,
            "unsubscribes": self.unsubscribes,
            "excused_in_flight": r.excused_in_flight,
            "excused_first_after_resume": r.excused_first_after_resume,
            "fence_regressions": r.fence_regressions[:100],
            "token_decreases": r.token_decreases[:100],
            "tokens_checked": r.tokens_checked,
            "order_violations": r.order_violations[:100],
            "overlap_in_key": r.overlap_in_key[:100],
            "duplicate_runs": dict(r.duplicate_runs),
            "duplicate_examples": r.duplicate_examples,
            "duplicate_writes": dict(r.duplicate_writes),
            "duplicate_write_examples": r.duplicate_write_examples,
            "reruns_after_interrupt": dict(r.reruns_after_interrupt),
            "rerun_examples": r.rerun_examples,
            "features": r.features.as_json(),
            "final_state": self.final_state,
            "anomalies": self.anomalies[:200],
            "log_lines": self.log_lines,
            "start_refusals": self.start_refusals,
            "elapsed": self.elapsed,
        }


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.most_common())


# -- the moving parts -----------------------------------------------------------------------
@dataclass
class Slot:
    """A worker slot: one worker process at a time, and its proxies."""

    index: int
    proc: Proc | None = None
    generation: int = 0
    busy: bool = False  # a fault owns it; the watchdog leaves it alone
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    group: str = GROUP
    sync: bool = False  # runs the plain ``def`` handler
    letter: str = "w"

    @property
    def name(self) -> str:
        return f"{self.letter}{self.index}"

    @property
    def redis_proxy(self) -> str:
        return f"{self.name}.redis"

    @property
    def coordinator_proxies(self) -> tuple[str, str]:
        return f"{self.name}.coordinator-a", f"{self.name}.coordinator-b"


@dataclass
class Replica:
    name: str
    port: int
    proc: Proc | None = None
    generation: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Producer:
    """Publishes uniquely numbered, keyed messages at a steady rate; a batch is retried
    with the same event ids until ``publish_many`` returns."""

    def __init__(self, index: int, app: App, config: ChaosConfig, run: ChaosRun) -> None:
        self.index = index
        self.app = app
        self.config = config
        self.run_ = run
        self.rng = random.Random(f"{config.seed}/producer/{index}")
        self.rate = config.rate / config.producers
        self.batch = max(1, round(self.rate / 10))
        self.n = 0
        self.acked: list[Acked] = []
        self.failed_attempts = 0
        self.errors: Counter[str] = Counter()
        self.retried_ids = 0
        self.dedup_hits = 0
        self.unacked = 0
        self.done = anyio.Event()

    def _record(self) -> tuple[Record, bool]:
        event_id = f"p{self.index}-{self.n:07d}"
        self.n += 1
        poison = self.rng.random() < self.config.poison
        value: dict[str, Any] = {"id": event_id}
        work = round(self.rng.uniform(0, self.config.max_work), 4)
        if self.rng.random() < self.config.long_share:
            work = round(self.rng.uniform(0.2, self.config.long_work), 3)
            self.run_.long_runs += 1
        if work:
            value["work"] = work
        delay = None
        if self.rng.random() < self.config.delay_share:
            delay = round(self.rng.uniform(0.2, self.config.max_delay), 3)
        if poison:
            value["poison"] = True
            key = f"poison-{event_id}"
        else:
            key = f"p{self.index}k{self.rng.randrange(self.config.keys)}"
            if self.rng.random() < self.config.flaky:
                value["flaky"] = True
        return Record(value, key=key, event_id=event_id, delay=delay), poison

    async def run(self, stop: anyio.Event) -> None:
        interval = self.batch / self.rate
        next_at = time.monotonic()
        try:
            while not stop.is_set():
                batch = [self._record() for _ in range(self.batch)]
                await self._publish(batch, stop)
                next_at += interval
                wait = next_at - time.monotonic()
                if wait > 0:
                    with anyio.move_on_after(wait):
                        await stop.wait()
                else:
                    next_at = time.monotonic()  # fell behind (a fault): no burst after it
        finally:
            self.done.set()

    async def _publish(self, batch: list[tuple[Record, bool]], stop: anyio.Event) -> None:
        records = [r for r, _ in batch]
        begun = time.monotonic()
        retried = False
        delay = 0.1
        give_up: float | None = None
        while True:
            try:
                results = await self.app.publish_many(STREAM, records)
            except Exception as e:  # any failure: the outcome is unknown, retry as is
                self.failed_attempts += 1
                self.errors[type(e).__name__] += 1
                retried = True
                if stop.is_set():
                    give_up = give_up or time.monotonic() + 60
                    if time.monotonic() > give_up:
                        self.unacked += len(records)
                        return
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            break
        if retried:
            self.retried_ids += len(records)
        for (record, poison), published in zip(batch, results, strict=True):
            self.dedup_hits += published.duplicate
            self.acked.append(
                Acked(
                    record.event_id or "",
                    record.key,
                    published.shard,
                    published.entry_id or "",  # '': delayed, not in the stream yet
                    published.duplicate,
                    retried,
                    poison,
                    begun,
                    published.due_ms,
                )
            )


class LogReader:
    """Reads the processing log incrementally (it only grows)."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.key = chaosapp.log_key(PREFIX)
        self.lines: list[bytes] = []

    async def poll(self) -> int:
        """Fetch what was appended since the last poll; the number of lines so far."""
        while True:
            chunk = await self.redis.lrange(self.key, len(self.lines), len(self.lines) + 19_999)
            self.lines.extend(chunk)
            if len(chunk) < 20_000:
                return len(self.lines)


# -- the run ----------------------------------------------------------------------------------
class ChaosRun(NewFaults, Servers):
    """One chaos run (see the module docstring). ``await run()`` returns the result."""

    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        self.schedule = make_schedule(
            config.seed,
            config.duration,
            workers=config.workers,
            shards=config.shards,
            gap=config.gap,
            cover_all=config.cover_all,
            replicated=config.replica,
        )
        self.slots = [
            Slot(i, sync=config.sync_workers and i % 2 == 1) for i in range(config.workers)
        ]
        # The late group's workers (one async, one sync): not fault targets themselves,
        # but every fault that hits all processes (Redis, coordinators, scale) hits them.
        self.late_slots = (
            [Slot(i, group=LATE_GROUP, sync=i % 2 == 1, letter="l") for i in range(2)]
            if config.late_group
            else []
        )
        self.subscriptions: list[Subscription] = []
        self.users: dict[Role, tuple[str, str]] = {}  # role -> ACL user, password (acl)
        self.acl_refused: list[dict[str, str]] = []
        self.deaths: dict[int, float] = {}  # pid -> known dead by then (monotonic)
        self.fail_stops = 0  # workers that exited 75 (a sync run outlived its lease)
        self.long_runs = 0  # messages published with a long handler run
        self.unsubscribes = 0
        self.server = "Redis"
        self.replicas = [
            Replica("coordinator-a", free_port()),
            Replica("coordinator-b", free_port()),
        ]
        self.coordinator_lock = anyio.Lock()
        self.redis_lock = anyio.Lock()
        self.producer_lock = anyio.Lock()
        self.scale_lock = anyio.Lock()
        self.windows: list[FaultWindow] = []
        self.fault_counts: Counter[str] = Counter()
        self.faults_failed: list[str] = []
        self.anomalies: list[str] = []
        self.producers: list[Producer] = []
        self._connections: list[Any] = []
        self.start_refusals = 0  # processes that exited at start: Redis unreachable
        self.unclosed_pipelines = 0  # redis-py's "Unclosed Pipeline client" in this process
        self.t0 = 0.0
        self.shard_count = config.shards
        self._redis_down = False
        self.pair: RedisPair | None = None
        self.paused_in_flight = 0  # coordinator pauses that caught a request inside
        self.windows_failover: list[dict[str, Any]] = []
        self.healed_ms = 0  # wall clock ms when the faults were healed

    # -- output --------------------------------------------------------------------------
    def say(self, text: str) -> None:
        if not self.config.quiet:
            stamp = f"[{time.monotonic() - self.t0:8.1f}s]" if self.t0 else "[   setup ]"
            print(f"{stamp} {text}", flush=True)

    def anomaly(self, text: str) -> None:
        self.anomalies.append(text)
        self.say(f"ANOMALY: {text}")

    # -- processes -----------------------------------------------------------------------
    def _worker_env(self, slot: Slot) -> dict[str, str]:
        hub = self.hub
        a, b = (hub.proxies[n] for n in slot.coordinator_proxies)
        urls = [f"http://127.0.0.1:{a.port}", f"http://127.0.0.1:{b.port}"]
        if slot.index % 2:
            urls.reverse()
        redis_url = f"redis://127.0.0.1:{hub.proxies[slot.redis_proxy].port}/0"
        return {
            "STREAMWORKS_REDIS_URL": self.role_url("worker", redis_url),
            "CHAOS_RECORD_REDIS_URL": redis_url,  # the app's records: the default user
            "STREAMWORKS_COORDINATOR_URLS": ",".join(urls),
            "CHAOS_SHARDS": str(self.config.shards),
            "CHAOS_GROUP": slot.group,
            "CHAOS_SYNC": "1" if slot.sync else "",
            "CHAOS_ENDS_DIR": str(self.ends_dir),
            **self._pair_env(),
        }

    def start_worker(self, slot: Slot) -> Proc:
        slot.generation += 1
        name = f"{slot.name}.{slot.generation}"
        slot.proc = self.cluster.start(name, "worker", TARGET, env=self._worker_env(slot))
        self._watch_death(slot.proc)
        return slot.proc

    def _watch_death(self, proc: Proc) -> None:
        """Record when the process ends, to the millisecond (a thread waits on its
        pidfd; nothing is reaped): a run without an end record ended by then. A
        watchdog's observation would be up to a second late and a fault may hold the
        slot for seconds (a fail-stop during a cut)."""
        try:
            fd = os.pidfd_open(proc.pid)
        except OSError:
            return

        def wait() -> None:
            try:
                select.select([fd], [], [])
                self.deaths.setdefault(proc.pid, time.monotonic())
            finally:
                os.close(fd)

        threading.Thread(target=wait, name=f"death-{proc.pid}", daemon=True).start()

    async def start_replica(self, replica: Replica) -> Proc:
        """Start the replica on its port and wait until it is ready. A coordinator
        refuses to start while Redis is unreachable (one error line, exit 1), as it
        should; like a supervisor, try again until Redis is back (bounded)."""
        deadline = time.monotonic() + 60
        while True:
            replica.generation += 1
            proc = self.cluster.start(
                f"{replica.name}.{replica.generation}",
                "coordinator",
                env={
                    "STREAMWORKS_COORDINATOR__PORT": str(replica.port),
                    "STREAMWORKS_REDIS_URL": self.role_url("coordinator", self.coordinator_redis),
                },
            )
            proc.url = replica.url
            replica.proc = proc
            try:
                await wait_ready(proc, timeout=30)
                return proc
            except AssertionError:
                if proc.alive() or time.monotonic() > deadline:
                    raise
                self.start_refusals += 1
                self.say(f"{replica.name} exited at start ({proc.output().strip()[-120:]}); again")
                await anyio.sleep(0.5)

    def client(self) -> CoordinatorClient:
        return CoordinatorClient([r.url for r in self.replicas])

    # -- ACL users (config.acl) ------------------------------------------------------------
    def role_url(self, role: Role, url: str) -> str:
        """``url`` logging in as ``role``'s ACL user (``url`` itself without acl)."""
        if not self.config.acl:
            return url
        user, password = self.users[role]
        return with_credentials(url, user, password)

    async def _create_users(self) -> None:
        # ACL SETUSER is not replicated: on every server (the pair's replica too).
        for role in ROLES:
            self.users[role] = (f"chaos-{role}", secrets.token_hex(16))
        for admin in self._admins():
            for role, (user, password) in self.users.items():
                await admin.execute_command(*setuser_command(role, user, password, PREFIX))
            await admin.execute_command("ACL", "SAVE")
            await admin.aclose()
        self.say(f"ACL users: {', '.join(u for u, _ in self.users.values())}")

    async def _acl_log(self) -> list[dict[str, str]]:
        if not self.config.acl:
            return []
        found: list[dict[str, str]] = []
        for admin in self._admins():
            try:
                found += await acl_log(admin, {u for u, _ in self.users.values()})
            except (OSError, RedisError):
                pass  # a server down (restarting): its log was read before the kill
            finally:
                await admin.aclose()
        return found

    async def _acl_refusals(self) -> list[str]:
        """What Redis refused the role users during the run (``ACL LOG``, read before each
        Redis restart and at the end): each is a failure of the run."""
        refused = [*self.acl_refused, *await self._acl_log()]
        return [
            f"ACL: {e.get('username')} refused {e.get('reason')} {e.get('object')!r} "
            f"x{e.get('count', '1')}"
            for e in refused
        ]

    # -- the whole run ---------------------------------------------------------------------
    async def run(self) -> ChaosResult:
        config = self.config
        started = time.monotonic()
        workdir = config.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        # The workers' local end records (chaosapp: a run's end survives its SIGKILL).
        self.ends_dir = workdir / "ends"
        self.ends_dir.mkdir(exist_ok=True)
        self.say(f"chaos run, seed {config.seed}; replay with: {config.command()}")
        self.say(f"logs in {workdir}")
        self.say(f"fault schedule ({len(self.schedule)} faults):\n{format_schedule(self.schedule)}")
        (workdir / "schedule.txt").write_text(
            f"{config.command()}\n\n{format_schedule(self.schedule)}\n"
        )
        loop = asyncio.get_running_loop()
        default_handler = loop.get_exception_handler()

        def on_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            # redis-py reports a pipeline collected with a connection still held here
            # (see the producer bug in docs/reliability.md): count it, once a line.
            if context.get("message") == "Unclosed Pipeline client":
                self.unclosed_pipelines += 1
                return
            if default_handler is not None:
                default_handler(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(on_loop_error)
        self._late_done = anyio.Event()
        if not self.late_slots:
            self._late_done.set()
        self.hub = ProxyHub()
        try:
            # One server (AOF), or a primary+replica pair behind proxies (--replica).
            await self._servers(workdir, replica=config.replica, acl=config.acl)
            self.cluster = Cluster(self.front_url, PREFIX, workdir)
            if config.trace:  # every worker and coordinator: a history file of its own
                record_history(self.cluster.base_env, workdir / "history")
            info = await self.redis.info("server")
            self.server = (
                f"Valkey {info['valkey_version']}"
                if info.get("valkey_version")
                else f"Redis {info.get('redis_version', '?')}"
            )
            self.say(f"server: {self.server} ({self.binary}){self._topology()}")
            if config.acl:
                await self._create_users()
            await self._start()
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                for producer in self.producers:
                    tg.start_soon(producer.run, stop)
                tg.start_soon(self._watchdog)
                tg.start_soon(self._progress)
                self.t0 = time.monotonic()
                self.say("fault phase begins")
                if self.late_slots:
                    tg.start_soon(self._late_group)
                await self._play(self.schedule)
                with anyio.fail_after(300):
                    await self._late_done.wait()
                self.say("fault phase over: healing")
                await self._heal()
                self.healed_ms = int(time.time() * 1000)  # schedules must tick after it
                # A little traffic on the healed system, then stop the producers.
                await anyio.sleep(3)
                stop.set()
                with anyio.fail_after(150):
                    for producer in self.producers:
                        await producer.done.wait()
                self.say(f"producers stopped: {sum(len(p.acked) for p in self.producers)} acked")
                final_state = await self._settle()
                final_state += await self._acl_refusals()
                tg.cancel_scope.cancel()
            report = await self._check()
            if config.trace:
                trace = await anyio.to_thread.run_sync(check_directory, workdir / "history")
                self.say(trace[1])
        finally:
            await self._teardown()
            loop.set_exception_handler(default_handler)
        result = ChaosResult(
            config=config,
            report=report,
            published=sum(len(p.acked) for p in self.producers),
            publish_attempts_failed=sum(p.failed_attempts for p in self.producers),
            publish_errors=sum((p.errors for p in self.producers), Counter()),
            publish_retried_ids=sum(p.retried_ids for p in self.producers),
            publish_dedup_hits=sum(p.dedup_hits for p in self.producers),
            unacked=sum(p.unacked for p in self.producers),
            faults=self.fault_counts,
            faults_failed=self.faults_failed,
            final_state=final_state,
            anomalies=[
                *self.anomalies,
                *report.anomalies,
                *(
                    [
                        f"producers: {self.unclosed_pipelines} redis-py pipelines collected "
                        "while still holding a connection (publish_many after an error)"
                    ]
                    if self.unclosed_pipelines
                    else []
                ),
            ],
            start_refusals=self.start_refusals,
            log_lines=self._scan_logs(),
            elapsed=time.monotonic() - started,
            workdir=workdir,
            fail_stops=self.fail_stops,
            long_runs=self.long_runs,
            unsubscribes=self.unsubscribes,
            server=self.server,
            **({"trace": trace} if config.trace else {}),
            fault_rows=self.fault_rows(),
        )
        (workdir / "report.json").write_text(json.dumps(result.as_json(), indent=2))
        (workdir / "report.md").write_text(result.table() + "\n")
        return result

    async def _start(self) -> None:
        config = self.config
        # Each replica behind an HTTP proxy (held/duplicated/reordered requests); each
        # worker reaches those through TCP proxies of its own (cuts and delays).
        for replica in self.replicas:
            name = http_proxy_name(replica.name)
            await self.hub.add_http(name, replica.port, seed=self.config.seed)
        for slot in [*self.slots, *self.late_slots]:
            await self._redis_front(slot.redis_proxy)
            for proxy, replica in zip(slot.coordinator_proxies, self.replicas, strict=True):
                await self.hub.add(proxy, self.hub.http[http_proxy_name(replica.name)].port)
        await self._redis_front("producers.redis")
        for replica in self.replicas:
            await self.start_replica(replica)
        async with self.client() as client:
            await client.create_stream(STREAM, config.shards)
            # The chaos app's schedule: its target stream and the schedules' stream.
            await client.create_stream(chaosapp.TICKS, chaosapp.TICK_SHARDS)
            await client.create_stream(Keyspace.SCHEDULE_STREAM, 1)
        for slot in self.slots:
            self.start_worker(slot)
        await self._wait_group(config.workers, timeout=60)
        self.say(f"{config.workers} workers stable on {config.shards} shards")
        proxy_port = self.hub.proxies["producers.redis"].port
        for i in range(config.producers):
            settings = Settings(
                redis_url=self.role_url("producer", f"redis://127.0.0.1:{proxy_port}/0"),
                key_prefix=PREFIX,
                coordinator_urls=[r.url for r in self.replicas],
                heartbeat_interval=float(FAST_TIMERS["STREAMWORKS_HEARTBEAT_INTERVAL"]),
                lease_ttl=LEASE_TTL,
                routing_lease=float(FAST_TIMERS["STREAMWORKS_ROUTING_LEASE"]),
            )
            app = App(f"chaos-producer-{i}", settings=settings)
            # --replica: durable publishes (acknowledged once the replica has them).
            app.stream(
                STREAM, shards=config.shards, dedup_window=3600, min_replicas=self._min_replicas()
            )
            self._connections.append(app.connect())
            await self._connections[-1].__aenter__()
            self.producers.append(Producer(i, app, config, self))

    async def _wait_group(self, members: int, timeout: float, group: str = GROUP) -> None:
        async with self.client() as client:

            async def stable() -> bool:
                try:
                    state = await client.group(group)
                except CoordinatorError:
                    return False
                live = [m for m in state.members if m.state not in ("EXPIRED", "FENCED")]
                return state.state == "STABLE" and len(live) == members

            await wait_until(stable, timeout, f"{members} stable members of {group}")

    # -- faults ----------------------------------------------------------------------------
    async def _play(self, schedule: list[Fault]) -> None:
        async with anyio.create_task_group() as tg:
            for fault in schedule:
                wait = self.t0 + fault.at - time.monotonic()
                if wait > 0:
                    await anyio.sleep(wait)
                tg.start_soon(self._inject, fault)
            wait = self.t0 + self.config.duration - time.monotonic()
            if wait > 0:
                await anyio.sleep(wait)

    async def _inject(self, fault: Fault) -> None:
        try:
            with anyio.fail_after(120):
                await getattr(self, "_f_" + fault.kind.replace("-", "_"))(fault)
            self.fault_counts[fault.kind] += 1
        except Exception as e:
            text = f"{fault}: {type(e).__name__}: {e}"
            self.faults_failed.append(text)
            self.anomaly(f"fault could not be completed: {text}")

    def _window(self, fault: Fault, start: float, pids: tuple[int, ...] = ()) -> None:
        self.windows.append(
            FaultWindow(fault.kind, fault.target, start, time.monotonic(), pids, fault.params)
        )

    def _slot(self, fault: Fault) -> Slot:
        return self.slots[int(fault.target[1:])]

    async def _f_worker_kill(self, fault: Fault) -> None:
        slot = self._slot(fault)
        async with slot.lock:
            slot.busy = True
            try:
                proc = await self._live_worker(slot)
                start = time.monotonic()
                proc.send(signal.SIGKILL)
                await proc.wait_exit(10)
                self.deaths.setdefault(proc.pid, time.monotonic())
                self.say(f"{fault.kind} {slot.name} (pid {proc.pid})")
                await anyio.sleep(fault.params["down"])
                self.start_worker(slot)
                self._window(fault, start, (proc.pid,))
            finally:
                slot.busy = False

    async def _f_worker_pause(self, fault: Fault) -> None:
        slot = self._slot(fault)
        async with slot.lock:
            slot.busy = True
            try:
                proc = await self._live_worker(slot)
                start = time.monotonic()
                proc.send(signal.SIGSTOP)
                self.say(
                    f"{fault.kind} {slot.name} (pid {proc.pid}) for {fault.params['seconds']}s"
                )
                try:
                    await anyio.sleep(fault.params["seconds"])
                finally:
                    proc.send(signal.SIGCONT)
                    self._window(fault, start, (proc.pid,))
            finally:
                slot.busy = False

    async def _f_worker_term(self, fault: Fault) -> None:
        slot = self._slot(fault)
        async with slot.lock:
            slot.busy = True
            try:
                proc = await self._live_worker(slot)
                start = time.monotonic()
                proc.send(signal.SIGTERM)
                timeout = float(FAST_TIMERS["STREAMWORKS_WORKER__SHUTDOWN_TIMEOUT"]) + 10
                try:
                    code = await proc.wait_exit(timeout)
                except AssertionError:
                    self.anomaly(
                        f"{slot.name} (pid {proc.pid}) still running {timeout}s after SIGTERM"
                    )
                    proc.send(signal.SIGKILL)
                    code = await proc.wait_exit(10)
                took = time.monotonic() - start
                self.deaths.setdefault(proc.pid, time.monotonic())
                self.say(
                    f"{fault.kind} {slot.name} (pid {proc.pid}): exit {code} after {took:.1f}s"
                )
                if code == FAIL_STOP_EXIT_CODE:
                    self._fail_stopped(slot.name, proc)
                elif code not in (0, -signal.SIGTERM, -signal.SIGKILL):
                    self.anomaly(f"{slot.name} (pid {proc.pid}) exited {code} on SIGTERM")
                await anyio.sleep(fault.params["down"])
                self.start_worker(slot)
                self._window(fault, start, (proc.pid,))
            finally:
                slot.busy = False

    async def _live_worker(self, slot: Slot) -> Proc:
        """The slot's process, started again first if it died (the watchdog's job,
        done here when a fault gets the slot first)."""
        if slot.proc is None or not slot.proc.alive():
            self._unexpected_exit(slot.name, slot.proc)
            self.start_worker(slot)
        assert slot.proc is not None
        return slot.proc

    def _unexpected_exit(self, name: str, proc: Proc | None) -> None:
        if proc is None:
            return
        output = proc.output()
        self.deaths.setdefault(proc.pid, time.monotonic())
        if proc.popen.poll() == FAIL_STOP_EXIT_CODE:
            self._fail_stopped(name, proc)
            return
        if "cannot reach Redis" in output and proc.popen.poll() == 1:
            # A process started while its path to Redis was down refuses to start with
            # one clear line, as documented; a supervisor starts it again.
            self.start_refusals += 1
            self.say(f"{name} (pid {proc.pid}) refused to start: Redis unreachable; again")
            return
        tail = "\n".join(output.splitlines()[-15:])
        self.anomaly(f"{name} (pid {proc.pid}) exited by itself, rc {proc.popen.poll()}:\n{tail}")

    def _fail_stopped(self, name: str, proc: Proc) -> None:
        """A worker exited 75: a plain ``def`` run outlived its lease's fail-stop point
        (documented behaviour; a supervisor restarts it). Counted as its own cause."""
        now = time.monotonic()
        self.fail_stops += 1
        self.say(f"{name} (pid {proc.pid}) fail-stopped (exit {FAIL_STOP_EXIT_CODE}); restart")
        if "fail-stop" not in proc.output() and "fail_stop" not in proc.output():
            self.anomaly(f"{name} (pid {proc.pid}) exited {FAIL_STOP_EXIT_CODE} without a log line")
        # The exit was seen up to a watchdog period after it happened.
        self.windows.append(FaultWindow("fail-stop", name, now - 1.5, now, (proc.pid,)))

    # -- the late group ---------------------------------------------------------------------
    async def _late_group(self) -> None:
        """A second group subscribes mid-run (earliest: it must see every entry
        published from then on), is stopped, unsubscribed (``streamworks admin
        unsubscribe``) and subscribes again; each period is checked for loss."""
        try:
            duration = self.config.duration
            await anyio.sleep(duration * 0.15)
            since = await self._start_late("subscribes mid-run")
            await anyio.sleep(max(0.0, self.t0 + duration * 0.55 - time.monotonic()))
            # Let it catch up on what was published so far, then end the period.
            until = time.monotonic()
            await self._caught_up(LATE_GROUP, since, until)
            self.subscriptions.append(Subscription(LATE_GROUP, since, until))
            start = time.monotonic()
            pids: list[int] = []
            for slot in self.late_slots:
                async with slot.lock:
                    slot.busy = True
                    proc = await self._live_worker(slot)
                    pids.append(proc.pid)
                    proc.send(signal.SIGTERM)
                    code = await proc.wait_exit(
                        float(FAST_TIMERS["STREAMWORKS_WORKER__SHUTDOWN_TIMEOUT"]) + 20
                    )
                    self.deaths.setdefault(proc.pid, time.monotonic())
                    if code == FAIL_STOP_EXIT_CODE:
                        self._fail_stopped(slot.name, proc)
            await self._unsubscribe(LATE_GROUP)
            self.unsubscribes += 1
            self.windows.append(
                FaultWindow("unsubscribe", LATE_GROUP, start, time.monotonic(), tuple(pids))
            )
            since = await self._start_late("subscribes again after its unsubscribe")
            self.subscriptions.append(Subscription(LATE_GROUP, since))
        except Exception as e:
            self.anomaly(f"late group scenario failed: {type(e).__name__}: {e}")
            self.faults_failed.append(f"late group: {type(e).__name__}: {e}")
        finally:
            for slot in self.late_slots:
                slot.busy = False
            self._late_done.set()

    async def _start_late(self, what: str) -> float:
        for slot in self.late_slots:
            async with slot.lock:
                self.start_worker(slot)
                slot.busy = False
        await self._wait_group(len(self.late_slots), timeout=120, group=LATE_GROUP)
        self.say(f"group {LATE_GROUP} {what}: {len(self.late_slots)} members stable")
        return time.monotonic()

    async def _caught_up(self, group: str, since: float, until: float) -> None:
        due = {
            a.id for p in self.producers for a in p.acked if since <= a.t < until and not a.poison
        }
        reader = LogReader(self.log_redis)
        handled: set[str] = set()
        scanned = 0

        async def done() -> bool:
            nonlocal scanned
            if self._redis_down:
                return False
            try:
                await reader.poll()
            except Exception:
                return False
            for line in reader.lines[scanned:]:
                body = json.loads(line.rsplit(b"|", 2)[0])
                if body["ev"] == "end" and body.get("g") == group:
                    handled.add(body["i"])
            scanned = len(reader.lines)
            return due <= handled

        try:
            await wait_until(done, 120, f"group {group} caught up", 1.0)
        except AssertionError:
            self.anomaly(f"group {group} did not catch up in 120 s: {len(due - handled)} left")

    async def _unsubscribe(self, group: str) -> None:
        """``streamworks admin unsubscribe GROUP chaos --yes`` until it is accepted (it
        is refused while the group still has live members: their leave is recorded)."""
        env = {
            "STREAMWORKS_COORDINATOR_URLS": ",".join(r.url for r in self.replicas),
            "STREAMWORKS_REDIS_URL": self.front_url,
        }
        last = ""

        async def accepted() -> bool:
            nonlocal last
            done = await self.cluster.cli("admin", "unsubscribe", group, STREAM, "--yes", env=env)
            last = (done.stdout + done.stderr).decode().strip()
            return done.returncode == 0

        await wait_until(accepted, 90, f"unsubscribe of {group} accepted (last: {last!r})", 1.0)
        self.say(f"{last}")

    async def _f_coordinator_kill(self, fault: Fault) -> None:
        replica = next(r for r in self.replicas if r.name == fault.target)
        async with self.coordinator_lock:
            assert replica.proc is not None
            proc = replica.proc
            start = time.monotonic()
            proc.send(signal.SIGKILL)
            await proc.wait_exit(10)
            self.say(f"{fault.kind} {replica.name} (pid {proc.pid})")
            await anyio.sleep(fault.params["down"])
            await self.start_replica(replica)
            self._window(fault, start, (proc.pid,))

    async def _f_coordinator_rolling(self, fault: Fault) -> None:
        async with self.coordinator_lock:
            start = time.monotonic()
            pids = []
            for replica in self.replicas:
                assert replica.proc is not None
                proc = replica.proc
                pids.append(proc.pid)
                proc.send(signal.SIGTERM)
                try:
                    code = await proc.wait_exit(20)
                except AssertionError:
                    self.anomaly(f"{replica.name} (pid {proc.pid}) ignored SIGTERM for 20s")
                    proc.send(signal.SIGKILL)
                    code = await proc.wait_exit(10)
                if code != 0:
                    self.anomaly(f"{replica.name} (pid {proc.pid}) exited {code} on SIGTERM")
                await self.start_replica(replica)
            self.say(f"{fault.kind}: both replicas restarted in {time.monotonic() - start:.1f}s")
            self._window(fault, start, tuple(pids))

    async def _f_redis_restart(self, fault: Fault) -> None:
        async with self.redis_lock:
            start = time.monotonic()
            self._redis_down = True
            try:
                self.acl_refused += await self._acl_log()  # kept in memory only: read it now
                self.say(f"{fault.kind}: Redis killed, down for {fault.params['down']}s")
                await self._restart_primary(fault.params["down"])
            finally:
                self._redis_down = False
            self.say(f"{fault.kind}: Redis back after {time.monotonic() - start:.1f}s")
            self._window(fault, start)

    async def _path(self, fault: Fault) -> tuple[list[str], tuple[int, ...], anyio.Lock]:
        if fault.target == "producers":
            return ["producers.redis"], (os.getpid(),), self.producer_lock
        slot = self._slot(fault)
        pid = slot.proc.pid if slot.proc is not None else 0
        if fault.kind.endswith("redis"):
            return [slot.redis_proxy], (pid,), slot.lock
        return list(slot.coordinator_proxies), (pid,), slot.lock

    async def _f_cut_redis(self, fault: Fault) -> None:
        await self._cut(fault)

    async def _f_cut_coordinator(self, fault: Fault) -> None:
        await self._cut(fault)

    async def _cut(self, fault: Fault) -> None:
        names, _, lock = await self._path(fault)
        async with lock:
            _, pids, _ = await self._path(fault)
            seconds = fault.params["seconds"]
            start = time.monotonic()
            cut = 0
            for name in names:
                cut += await self.hub.cut(name, seconds)
            self.say(f"{fault.kind} {fault.target} for {seconds}s ({cut} connections reset)")
            await anyio.sleep(seconds)
            self._window(fault, start, pids)

    async def _f_delay_redis(self, fault: Fault) -> None:
        await self._delay(fault)

    async def _f_delay_coordinator(self, fault: Fault) -> None:
        await self._delay(fault)

    async def _delay(self, fault: Fault) -> None:
        names, _, lock = await self._path(fault)
        async with lock:
            _, pids, _ = await self._path(fault)
            start = time.monotonic()
            for name in names:
                await self.hub.delay(name, fault.params["ms"])
            ms, seconds = fault.params["ms"], fault.params["seconds"]
            self.say(f"{fault.kind} {fault.target}: +{ms}ms for {seconds}s")
            try:
                await anyio.sleep(fault.params["seconds"])
            finally:
                for name in names:
                    await self.hub.delay(name, 0)
                self._window(fault, start, pids)

    async def _f_scale(self, fault: Fault) -> None:
        shards = int(fault.params["shards"])
        async with self.scale_lock, self.client() as client:
            start = time.monotonic()

            async def scaled() -> bool:
                try:
                    await client.scale_stream(STREAM, shards)
                except CoordinatorError as e:
                    # An earlier try whose answer was lost (a cut, NOT_REPLICATED and
                    # finished by the coordinator's loop) did it: the retry is refused.
                    if not e.retryable and (await client.stream(STREAM)).shard_count == shards:
                        return True
                    if not e.retryable:
                        raise
                    return False
                return True

            await wait_until(scaled, 60, f"scale to {shards} shards", 0.5)
            self.say(f"scale {self.shard_count} -> {shards} shards")
            self.shard_count = shards
            self._window(fault, start)

    # -- background ----------------------------------------------------------------------------
    async def _watchdog(self) -> None:
        """Restart processes that died without a fault (and report them)."""
        while True:
            await anyio.sleep(1)
            for slot in [*self.slots, *self.late_slots]:
                if not slot.busy and not slot.lock.locked() and slot.proc and not slot.proc.alive():
                    self._unexpected_exit(slot.name, slot.proc)
                    self.start_worker(slot)
            if not self.coordinator_lock.locked():
                for replica in self.replicas:
                    if replica.proc is not None and not replica.proc.alive():
                        async with self.coordinator_lock:
                            self._unexpected_exit(replica.name, replica.proc)
                            try:
                                await self.start_replica(replica)
                            except AssertionError as e:
                                self.anomaly(f"{replica.name} did not come back: {e}")

    async def _progress(self) -> None:
        reader = LogReader(self.log_redis)
        while True:
            await anyio.sleep(self.config.progress_every)
            if self._redis_down:
                continue
            try:
                lines = await reader.poll()
            except Exception as e:
                self.say(f"progress: log not readable now ({type(e).__name__})")
                continue
            published = sum(len(p.acked) for p in self.producers)
            faults = sum(self.fault_counts.values())
            self.say(
                f"progress: {published} published, ~{lines // 2} handler runs logged, "
                f"{faults} faults done, {len(self.anomalies)} anomalies"
            )

    # -- the end -------------------------------------------------------------------------------
    async def _heal(self) -> None:
        await self.hub.heal()
        for slot in [*self.slots, *self.late_slots]:
            async with slot.lock:
                await self._live_worker(slot)
        async with self.coordinator_lock:
            for replica in self.replicas:
                if replica.proc is None or not replica.proc.alive():
                    self._unexpected_exit(replica.name, replica.proc)
                    await self.start_replica(replica)

    async def _status(self) -> StatusResponse:
        async with self.client() as client:
            return await client.status()

    async def _settle(self) -> list[str]:
        """Wait (bounded) until every acked publish was handled or dead-lettered and the
        stream is drained; what is still not so."""
        problems: list[str] = []
        every = [a for p in self.producers for a in p.acked]
        acked = {a.id for a in every}
        # Per group: what it must have handled (the late group: its periods).
        due: dict[str, set[str]] = {GROUP: acked}
        for sub in self.subscriptions:
            due.setdefault(sub.group, set()).update(
                a.id for a in every if sub.since <= a.t < sub.until
            )
        reader = LogReader(self.log_redis)
        handled_by: dict[str, set[str]] = {g: set() for g in due}
        handled = handled_by[GROUP]
        scanned = 0

        async def all_handled() -> bool:
            nonlocal scanned
            await reader.poll()
            for line in reader.lines[scanned:]:
                body = json.loads(line.rsplit(b"|", 2)[0])
                if body["ev"] == "end":
                    handled_by.setdefault(body.get("g", GROUP), set()).add(body["i"])
            scanned = len(reader.lines)
            dead = await self._dead_letters()
            return all(
                ids <= handled_by[g] | {d.id for d in dead if d.group == g}
                for g, ids in due.items()
            )

        try:
            await wait_until(
                all_handled, self.config.settle_timeout, "every acked message handled", 2.0
            )
            self.say("every acked publish handled or dead-lettered")
        except AssertionError:
            missing = acked - handled
            problems.append(
                f"{len(missing)} acked messages not handled after "
                f"{self.config.settle_timeout:g}s, e.g. {sorted(missing)[:5]}"
            )

        async def drained() -> bool:
            status = await self._status()
            stream = next((s for s in status.streams if s.name == STREAM), None)
            if stream is None:
                return False
            if any(s.state != "ACTIVE" for s in stream.shards):
                return False
            return all(g.pending == 0 and g.lag == 0 for s in stream.shards for g in s.groups)

        try:
            await wait_until(
                drained, 120, "the stream drained (no DRAINING shard, pending 0, lag 0)", 1.0
            )
            self.say("stream drained: no draining shard, pending 0 and lag 0 everywhere")
        except AssertionError as e:
            status = await self._status()
            stream = next((s for s in status.streams if s.name == STREAM), None)
            detail = (
                [
                    f"{s.shard} {s.state} "
                    + ",".join(f"pending={g.pending} lag={g.lag}" for g in s.groups)
                    for s in stream.shards
                ]
                if stream
                else []
            )
            problems.append(f"not drained: {e}; {detail}")
        return problems

    async def _dead_letters(self) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        for group in (GROUP, LATE_GROUP) if self.late_slots else (GROUP,):
            key = Keyspace(PREFIX).dead_letters(group, STREAM)
            for _, fields in await self.redis.xrange(key):
                payload = json.loads(fields.get(b"o.v", b"{}"))
                out.append(
                    DeadLetter(
                        str(payload.get("id", "?")),
                        fields.get(b"shard", b"").decode(),
                        fields.get(b"entry_id", b"").decode(),
                        fields.get(b"reason", b"").decode(),
                        int(fields.get(b"attempts", b"0")),
                        group,
                    )
                )
        return out

    async def _check(self) -> CheckReport:
        reader = LogReader(self.log_redis)
        await reader.poll()
        local_ends = [
            line
            for path in sorted(self.ends_dir.glob("ends-*.jsonl"))
            for line in path.read_bytes().splitlines()
        ]
        runs = parse_log(reader.lines, local_ends)
        acked = [a for p in self.producers for a in p.acked]
        dead = await self._dead_letters()
        report = check(
            runs,
            acked,
            dead,
            self.windows,
            main_group=GROUP,
            subscriptions=self.subscriptions,
            deaths=self.deaths,
            run_end=time.monotonic(),
            delayed=delayed_starts(reader.lines),
            wall_offset=time.time() - time.monotonic(),
        )
        await self._check_features(report.features)
        (self.workdir / "dead_letters.json").write_text(json.dumps([asdict(d) for d in dead]))
        # Kept for a post-mortem.
        lines = reader.lines
        await anyio.to_thread.run_sync(_write_gz, self.workdir / "processings.log.gz", lines)
        windows = [asdict(w) for w in self.windows]
        (self.workdir / "faults.json").write_text(json.dumps(windows, indent=1, default=str))
        acked_rows = [asdict(a) for a in acked]
        await anyio.to_thread.run_sync(
            _write_gz, self.workdir / "acked.jsonl.gz", [json.dumps(a).encode() for a in acked_rows]
        )
        return report

    async def _check_features(self, features: FeatureReport) -> None:
        """The schedule's ticks (waiting, bounded, for one after the heal) and the
        delayed keys left at the end (feature_checks.py)."""
        status = await self._status()
        shards = {
            s.name: [x.shard for x in s.shards if x.state != "RETIRED"] for s in status.streams
        }
        ticks: list[TickEntry] = []

        async def ticked() -> bool:
            nonlocal ticks
            ticks = await read_ticks(self.redis, PREFIX, shards.get(chaosapp.TICKS, []))
            return any(t.tick_ms >= self.healed_ms for t in ticks)

        try:
            await wait_until(ticked, 30, "a schedule tick after the heal", 1.0)
        except AssertionError:
            pass  # check_ticks names the schedule that stopped
        check_ticks(features, ticks, healed_ms=self.healed_ms)
        features.leftover_keys = await leftover_delayed_keys(
            self.redis, PREFIX, STREAM, shards.get(STREAM, [])
        )
        active = set(shards.get(STREAM, []))
        features.delayed_on_retired = sum(
            1 for p in self.producers for a in p.acked if a.due_ms and a.shard not in active
        )

    def _scan_logs(self) -> dict[str, int]:
        patterns = {
            "Traceback": "tracebacks",
            " ERROR ": "ERROR lines",
            "fenced out of": "fenced reads",
            "assignment lease expired": "lease losses",
            "ack flush failed": "ack flushes failed",
            "UNKNOWN_MEMBER": "UNKNOWN_MEMBER answers",
            "FENCED": "FENCED answers",
            "repaired to 0": "lag repairs",
        }
        counts: Counter[str] = Counter()
        for proc in self.cluster.procs:
            text = proc.output()
            for needle, label in patterns.items():
                counts[label] += text.count(needle)
        return dict(counts)

    async def _teardown(self) -> None:
        for connection in reversed(self._connections):
            try:
                with anyio.move_on_after(10, shield=True):
                    await connection.__aexit__(None, None, None)
            except Exception:
                pass
        self._connections.clear()
        if hasattr(self, "cluster"):
            self.cluster.kill_all()
        await self._stop_servers()
        if hasattr(self, "hub"):
            self.hub.close()


def _write_gz(path: Path, lines: list[bytes]) -> None:
    with gzip.open(path, "wb", compresslevel=3) as out:
        for line in lines:
            out.write(line + b"\n")


async def run_chaos(config: ChaosConfig) -> ChaosResult:
    """Run one chaos run and print its figures."""
    run = ChaosRun(config)
    result = await run.run()
    if not config.quiet:
        print("\n" + result.table(), flush=True)
        for failure in result.failures():
            print(f"FAILURE: {failure}", flush=True)
        for anomaly in result.anomalies[:30]:
            print(f"note: {anomaly}", flush=True)
        print(f"\nreplay: {config.command()}\nlogs and report: {result.workdir}", flush=True)
    return result
