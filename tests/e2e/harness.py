"""Real processes for the end-to-end tests: coordinators, workers and CLI commands.

:class:`Cluster` starts ``python -m streamworks ...`` children with the test's Redis
URL, key prefix and short timers in their environment, keeps each one's output in a
log file, and kills whatever is still running at teardown. The helpers below wait on
conditions with deadlines (never on fixed sleeps) and read back what the instrumented
app (``tests/e2e/apps/instrumented.py``) recorded.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import orjson

from streamworks import App, Published, Record
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.client import CoordinatorClient
from streamworks.protocol.control import GroupInfo, MemberInfo
from streamworks.settings import Settings
from tests.e2e.apps import instrumented

REPO = Path(__file__).resolve().parents[2]
INSTRUMENTED = "tests.e2e.apps.instrumented:app"
GROUP = instrumented.GROUP
STREAM = instrumented.STREAM
T = TypeVar("T")

#: Short timers for every child process (seconds). Tests override some per process.
FAST_TIMERS: dict[str, str] = {
    "STREAMWORKS_HEARTBEAT_INTERVAL": "0.2",
    "STREAMWORKS_LEASE_TTL": "2",
    "STREAMWORKS_REBALANCE_TIMEOUT": "5",
    "STREAMWORKS_ROUTING_LEASE": "3",
    "STREAMWORKS_STALE_MEMBER_RETENTION": "120",
    "STREAMWORKS_COORDINATOR__LOOP_INTERVAL": "0.1",
    "STREAMWORKS_COORDINATOR__ASSIGNMENT_INTERVAL": "0.05",
    "STREAMWORKS_WORKER__BLOCK": "0.5",
    "STREAMWORKS_WORKER__SHUTDOWN_TIMEOUT": "10",
    "STREAMWORKS_WORKER__LEASE_GRACE": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_until(
    probe: Callable[[], Awaitable[T | None]],
    timeout: float,
    message: str,
    interval: float = 0.05,
) -> T:
    """Poll ``probe`` until it returns something other than None (or False); fail
    after ``timeout`` seconds, saying what was awaited and what was seen last."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            result = await probe()
        except (CoordinatorError, httpx.TransportError) as e:
            result, last = None, e
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {last})")
        await anyio.sleep(interval)


# -- processes ------------------------------------------------------------------------
class Proc:
    """One child process and its log file."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path, url: str = ""):
        self.name = name
        self.popen = popen
        self.log_path = log
        self.url = url  # a coordinator's base URL

    def __repr__(self) -> str:
        return f"Proc({self.name}, pid={self.pid})"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    async def wait_exit(self, timeout: float) -> int:
        """Wait (bounded) for the process to exit; its exit code."""
        deadline = time.monotonic() + timeout
        while (code := self.popen.poll()) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not exit within {timeout}s")
            await anyio.sleep(0.02)
        return code

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def spawn(
    name: str,
    args: Sequence[str],
    env: Mapping[str, str],
    workdir: Path,
    *,
    cwd: Path = REPO,
) -> Proc:
    """Start ``python *args`` from ``cwd`` (the repository root) in a session of its own
    (a terminal's Ctrl-C never reaches it; its process group can be killed as one)."""
    log = workdir / f"{name}.log"
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            [sys.executable, *args],
            env=dict(env),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Proc(name, popen, log)


class Cluster:
    """The processes of one test, all on one Redis URL and key prefix."""

    def __init__(
        self,
        redis_url: str,
        prefix: str,
        workdir: Path,
        *,
        role_urls: Mapping[str, str] | None = None,
    ) -> None:
        self.redis_url = redis_url
        #: role -> URL of its ACL user (``--redis-acl``): coordinators, workers and the
        #: producers of :meth:`settings` log in as their role; CLI commands as redis_url.
        self.role_urls = dict(role_urls or {})
        self.prefix = prefix
        self.workdir = workdir
        self.procs: list[Proc] = []
        base = {k: v for k, v in os.environ.items() if not k.startswith("STREAMWORKS_")}
        self.base_env: dict[str, str] = {
            **base,
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "STREAMWORKS_REDIS_URL": redis_url,
            "E2E_RECORD_AS_DEFAULT_USER": "1",  # the test apps' records (apps/__init__.py)
            "STREAMWORKS_KEY_PREFIX": prefix,
            **FAST_TIMERS,
            # Several workers per test (and tests side by side): each worker's HTTP
            # endpoint on a free port of its own, unless a test names one.
            "STREAMWORKS_WORKER__HTTP_PORT": "0",
        }
        self.coordinators: list[Proc] = []

    def settings(self, **changes: Any) -> Settings:
        """Settings for the test process itself (producers, clients)."""
        return Settings(
            redis_url=self.role_urls.get("producer", self.redis_url),
            key_prefix=self.prefix,
            coordinator_urls=[c.url for c in self.coordinators] or ["http://127.0.0.1:1"],
            heartbeat_interval=0.2,
            lease_ttl=2,
            routing_lease=3,
        ).model_copy(update=changes)

    def client(self, *coordinators: Proc) -> CoordinatorClient:
        """A coordinator client of ``coordinators`` (all started ones by default)."""
        return CoordinatorClient([c.url for c in (coordinators or self.coordinators)])

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**self.base_env, **(extra or {})}

    def start(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> Proc:
        """Start ``python -m streamworks *args`` (output in ``<workdir>/<name>.log``)."""
        proc = spawn(name, ["-m", "streamworks", *args], self.env(env), self.workdir)
        self.procs.append(proc)
        return proc

    def start_coordinator(self, name: str = "coordinator", **env: str) -> Proc:
        port = free_port()
        own = {"STREAMWORKS_REDIS_URL": self.role_urls["coordinator"]} if self.role_urls else {}
        proc = self.start(
            name, "coordinator", env={**own, "STREAMWORKS_COORDINATOR__PORT": str(port), **env}
        )
        proc.url = f"http://127.0.0.1:{port}"
        self.coordinators.append(proc)
        return proc

    def start_worker(
        self,
        name: str,
        *,
        coordinators: Sequence[Proc] | None = None,
        target: str = INSTRUMENTED,
        args: Sequence[str] = (),
        **env: str,
    ) -> Proc:
        urls = ",".join(c.url for c in (coordinators or self.coordinators))
        own = {"STREAMWORKS_REDIS_URL": self.role_urls["worker"]} if self.role_urls else {}
        return self.start(
            name,
            "worker",
            target,
            *args,
            env={**own, "STREAMWORKS_COORDINATOR_URLS": urls, **env},
        )

    async def cli(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        timeout: float = 30,
        input: bytes | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run one ``streamworks`` command to completion (stdin: ``input``, else
        nothing: never a terminal)."""
        extra = {"STREAMWORKS_COORDINATOR_URLS": ",".join(c.url for c in self.coordinators)}
        with anyio.fail_after(timeout):
            return await anyio.run_process(
                [sys.executable, "-m", "streamworks", *args],
                input=input,
                env=self.env({**extra, **(env or {})}),
                cwd=REPO,
                check=False,
            )

    def kill_all(self) -> None:
        """SIGKILL every process still running (SIGCONT first: a stopped one too)."""
        for proc in self.procs:
            if proc.alive():
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        proc.send(sig)
                    except ProcessLookupError:
                        pass
        for proc in self.procs:
            try:
                proc.popen.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
                pass

    def report(self, lines: int = 40) -> str:
        """The tail of every process's log (printed at teardown, shown on failure)."""
        parts = []
        for proc in self.procs:
            tail = "\n".join(proc.output().splitlines()[-lines:])
            head = f"----- {proc.name} (pid {proc.pid}, rc {proc.popen.poll()}) -----"
            parts.append(f"{head}\n{tail}")
        return "\n".join(parts)


async def create_stream(cluster: Cluster, stream: str = STREAM) -> None:
    """Create the instrumented app's stream through the coordinator before any worker
    starts. Workers would create it themselves, but several doing so at once can hit
    a race in the coordinator (``Store.load_streams`` reads the revision and the
    registry separately, so a creation committed in between looks like lost
    metadata: a non-retryable METADATA_UNAVAILABLE that stops the worker)."""
    async with cluster.client() as client:
        await client.create_stream(stream, instrumented.SHARDS)


async def wait_ready(proc: Proc, timeout: float = 20) -> None:
    """Wait until a coordinator answers ``/readyz``."""

    async def ready() -> bool | None:
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited ({proc.popen.poll()}):\n{proc.output()}")
        async with httpx.AsyncClient(timeout=1) as http:
            return (await http.get(f"{proc.url}/readyz")).status_code == 200 or None

    await wait_until(ready, timeout, f"{proc.name} to be ready")


# -- the group as the coordinator sees it ---------------------------------------------
def live(group: GroupInfo) -> list[MemberInfo]:
    return [m for m in group.members if m.state not in ("EXPIRED", "FENCED")]


def member_of(group: GroupInfo, proc: Proc) -> MemberInfo | None:
    """The live member record of ``proc`` (by the pid it reported when joining)."""
    for m in live(group):
        if m.client.get("pid") == str(proc.pid):
            return m
    return None


def owners(group: GroupInfo) -> dict[str, list[str]]:
    """shard -> ids of the live members it is assigned to."""
    out: dict[str, list[str]] = defaultdict(list)
    for m in live(group):
        for s in m.assigned:
            out[s].append(m.member_id)
    return dict(out)


async def stream_shards(client: CoordinatorClient, stream: str = STREAM) -> list[str]:
    info = await client.stream(stream)
    return sorted(s.shard for s in info.shards if s.state == "ACTIVE")


async def wait_stable(
    client: CoordinatorClient,
    members: int,
    timeout: float = 30,
    group: str = GROUP,
) -> GroupInfo:
    """Wait until ``group`` is STABLE with ``members`` live members, every member at
    its target, and every shard assigned to exactly one of them."""
    shards = await wait_until(lambda: stream_shards(client), timeout, "the stream")

    async def settled() -> GroupInfo | None:
        info = await client.group(group)
        alive = live(info)
        if info.state != "STABLE" or len(alive) != members:
            return None
        if any(m.state != "STABLE" or sorted(m.assigned) != sorted(m.target) for m in alive):
            return None
        held = owners(info)
        if sorted(held) != shards or any(len(ids) != 1 for ids in held.values()):
            return None
        return info

    return await wait_until(settled, timeout, f"group {group} stable with {members} members")


# -- publishing -----------------------------------------------------------------------
def producer_app(cluster: Cluster) -> App:
    """A producer-only app on the cluster's coordinators (the stream exists already)."""
    app = App("e2e-producer", settings=cluster.settings())
    app.stream(STREAM, shards=instrumented.SHARDS)
    return app


def event(event_id: str, **fields: Any) -> Record:
    """A message of the instrumented app, keyed by the last two digits of its id (100 keys)."""
    return Record({"id": event_id, **fields}, key=f"k{event_id[-2:]}")


class Publisher:
    """Publishes numbered events in small batches until told to stop."""

    def __init__(self, app: App, prefix: str, batch: int = 10, pause: float = 0.02) -> None:
        self.app = app
        self.prefix = prefix
        self.batch = batch
        self.pause = pause
        self.published: list[str] = []
        # Where each message went (shard, entry id, routing version), in publish order.
        self.results: list[Published] = []
        self._stop = anyio.Event()
        self.done = anyio.Event()

    async def run(self) -> None:
        n = 0
        try:
            while not self._stop.is_set():
                records = [event(f"{self.prefix}-{n + i:06d}") for i in range(self.batch)]
                n += self.batch
                self.results.extend(await self.app.publish_many(STREAM, records))
                self.published.extend(r.value["id"] for r in records)
                # Pacing the producer, not synchronising: traffic keeps flowing.
                await anyio.sleep(self.pause)
        finally:
            self.done.set()

    async def burst(self, count: int) -> list[str]:
        """Publish ``count`` events at once (a backlog for the workers); their ids.

        Called while :meth:`run` publishes, the two calls' order in ``published`` is
        not necessarily the order Redis applied them in (use another Publisher when
        publish order matters)."""
        records = [event(f"{self.prefix}-burst-{i:06d}") for i in range(count)]
        self.results.extend(await self.app.publish_many(STREAM, records))
        ids = [r.value["id"] for r in records]
        self.published.extend(ids)
        return ids

    async def wait_count(self, count: int, timeout: float = 10) -> None:
        async def enough() -> bool:
            return len(self.published) >= count

        await wait_until(enough, timeout, f"{count} published")

    async def stop(self) -> list[str]:
        self._stop.set()
        with anyio.fail_after(10):
            await self.done.wait()
        return self.published


# -- what the instrumented handler recorded ---------------------------------------------
@dataclass
class Processing:
    """One run of the handler on one message by one member."""

    member: str
    pid: int
    shard: str
    entry: str
    id: str
    attempt: int
    start: int  # sequence number at the start
    fence: str  # the shard's owner fence at the start: "<epoch>:<member>"
    entered: float  # time.monotonic() when the handler was entered (system-wide clock)
    end: int | None = None  # sequence number when the handler returned

    def __str__(self) -> str:
        return (
            f"{self.member[:8]} {self.shard} {self.entry} attempt {self.attempt} "
            f"seq {self.start}-{self.end} fence {self.fence_epoch}:{self.fence_member[:8]}"
        )

    @property
    def fence_member(self) -> str:
        return self.fence.partition(":")[2]

    @property
    def fence_epoch(self) -> int:
        return int(self.fence.partition(":")[0] or 0)


async def processings(redis: Any, prefix: str) -> list[Processing]:
    """Every processing recorded so far, in start order."""
    raw = await redis.lrange(instrumented.log_key(prefix), 0, -1)
    started: dict[tuple[str, str, int], Processing] = {}
    ends: list[tuple[dict[str, Any], int]] = []
    for line in raw:
        body, seq, fence = line.decode().rsplit("|", 2)
        record = orjson.loads(body)
        if record["ev"] == "start":
            p = Processing(
                record["member"],
                record["pid"],
                record["shard"],
                record["entry"],
                record["id"],
                record["attempt"],
                int(seq),
                fence,
                record["entered"],
            )
            started[(p.member, p.entry, p.start)] = p
        else:
            ends.append((record, int(seq)))
    for record, seq in ends:
        started[(record["member"], record["entry"], record["start"])].end = seq
    return sorted(started.values(), key=lambda p: p.start)


def handled_ids(records: Iterable[Processing]) -> set[str]:
    return {p.id for p in records if p.end is not None}


async def wait_handled(
    redis: Any, prefix: str, ids: Iterable[str], timeout: float
) -> list[Processing]:
    """Wait until every event id in ``ids`` was handled to the end at least once."""
    wanted = set(ids)

    async def all_handled() -> list[Processing] | None:
        records = await processings(redis, prefix)
        return records if wanted <= handled_ids(records) else None

    try:
        return await wait_until(all_handled, timeout, f"{len(wanted)} events handled", 0.1)
    except AssertionError:
        missing = wanted - handled_ids(await processings(redis, prefix))
        raise AssertionError(
            f"{len(missing)} of {len(wanted)} events never handled, e.g. {sorted(missing)[:5]}"
        ) from None


def in_flight_when_paused(records: Iterable[Processing], member: str, resumed: float) -> set[int]:
    """The processings of ``member``, frozen (SIGSTOP) until ``resumed``, that were
    already under way when it froze (as ``id()`` of the records).

    Those are the handlers it had entered before, and one more: the process resumes
    in the middle of the task step it was frozen in, which may have passed the
    runtime's lease check and be about to enter a handler; only that single one, the
    first handler entered after the resume, can be such a step.
    """
    mine = [p for p in records if p.member == member]
    under_way = {id(p) for p in mine if p.entered < resumed}
    after = sorted((p for p in mine if p.entered >= resumed), key=lambda p: p.entered)
    if after:
        under_way.add(id(after[0]))
    return under_way


def assert_owner_at_start(records: Iterable[Processing], *, excused: Collection[int] = ()) -> None:
    """Every processing began while its member held the shard's owner fence: a member
    never starts a message of a shard that another member has been granted.

    ``excused``: processings that were under way when their member was frozen (see
    :func:`in_flight_when_paused`); in-flight work may finish after its shard moved.
    """
    bad = [p for p in records if p.fence_member != p.member and id(p) not in excused]
    assert not bad, f"{len(bad)} started without holding the fence: {[str(p) for p in bad[:5]]}"


def duplicates(records: Iterable[Processing]) -> dict[str, list[Processing]]:
    """Event id -> its processings, for events processed more than once to the end or
    started more than once."""
    by_id: dict[str, list[Processing]] = defaultdict(list)
    for p in records:
        by_id[p.id].append(p)
    return {i: ps for i, ps in by_id.items() if len(ps) > 1}
