"""What each operation of the runtime and the coordinator costs the Redis server.

The real code paths, on a private server (embedded Valkey, or ``--server``), one phase
at a time; around each phase the server's counters are reset (``CONFIG RESETSTAT``,
``SLOWLOG RESET`` with every command logged), and after it the script reports:

* **server µs per operation** — the sum of the ``SLOWLOG`` durations of the phase's
  commands (execution time inside the server: a script with the commands it calls, a
  transaction's commands one by one), divided by the operations done;
* **server CPU µs per operation** — ``INFO cpu`` (user + system) over the phase: also
  reading requests and writing replies; it has a 10 ms resolution, so phases are long;
* per command and per script (from the ``SLOWLOG``, a script named by its SHA or body):
  calls per operation and µs per call, what the operation is made of (the commands a
  script runs are logged too, with 0 µs: their time is the script's); ``INFO
  commandstats`` is kept in the JSON.

Phases: ``publish`` (one awaited ``app.publish``), ``publish-dedup`` (with an event id
on a stream with a dedup window), ``publish-many`` (per message of 100-message
batches), ``consume`` (a ``Worker`` with all shards, no-op handler: fenced reads and
group-committed acks; per message), ``consume-delete`` (``delete_on_ack``: + the trim
passes), ``retry`` (every message fails once: + a retry record, the redelivery),
``dead-letter`` (every message fails for good: + the dead letter), then the
coordinator's (``CoordinatorService``, the code the HTTP API calls): ``join`` (a
member joins: the full road of a heartbeat — the group commit and the fence writes),
``idle`` (the same worker on idle shards: the blocking waits; per shard-second),
``heartbeat`` (a no-change heartbeat: the short road), ``fence`` (one owner-fence
write), ``lag-read`` (the positions a lag-repair pass and a status read take per
shard: ``XLEN`` + ``XINFO GROUPS``).

``docs/sizing.md`` turns these into capacity figures. Run: ``python bench/op_costs.py``
(``--quick`` for a smoke run; ``--json FILE``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import common
from common import PREFIX, SHARDS

from streamworks.runtime.message import Context  # resolved by the handler's signature

#: The probe's own commands, left out of every table.
PROBE = frozenset({"config", "slowlog", "info", "ping", "client", "hello"})


@dataclass
class Phase:
    """The server-side cost of one phase of ``ops`` operations."""

    name: str
    ops: int
    unit: str
    #: command or script -> SLOWLOG durations (µs) of its calls in the phase.
    calls: dict[str, list[int]] = field(default_factory=dict)
    cpu_us: float = 0.0  # INFO cpu delta
    commands: dict[str, dict[str, float]] = field(default_factory=dict)
    excluded: tuple[str, ...] = ()

    @property
    def parts(self) -> dict[str, dict[str, float]]:
        """Per command / script: calls per operation, median and mean µs per call."""
        return {
            kind: {
                "per_op": round(len(us) / self.ops, 4),
                "median_us": float(statistics.median(us)),
                "mean_us": round(statistics.fmean(us), 2),
            }
            for kind, us in sorted(self.calls.items(), key=lambda kv: -sum(kv[1]))
        }

    @property
    def server_us(self) -> float:
        """Server execution µs per operation: Σ calls per op × median µs per call (the
        median, not the mean: a command preempted on a busy machine counts its wait)."""
        return sum(p["per_op"] * p["median_us"] for p in self.parts.values())

    def row(self) -> dict[str, Any]:
        return {
            "ops": self.ops,
            "unit": self.unit,
            "server_us_per_op": round(self.server_us, 2),
            "cpu_us_per_op": round(self.cpu_us / self.ops, 2),
            "parts": self.parts,
            "commandstats": self.commands,
            "excluded": list(self.excluded),
        }


def _script_names() -> tuple[dict[str, str], dict[str, str]]:
    """sha -> name and body prefix -> name of every streamworks script (``EVALSHA``
    sends the SHA; the fenced read's gates go as ``EVAL`` with the body)."""
    import hashlib

    from streamworks.redis.scripts import SCRIPT_NAMES, load_script, script_body

    by_sha, by_body = {}, {}
    for name in SCRIPT_NAMES:
        by_sha[hashlib.sha1(load_script(name).encode()).hexdigest()] = name
        by_body[script_body(name)[:60].decode()] = name
        by_body[load_script(name)[:60]] = name
    return by_sha, by_body


class Probe:
    """Reset the server's counters, let a phase run, read them back."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.by_sha, self.by_body = _script_names()

    async def start(self) -> float:
        await self.redis.config_set("slowlog-log-slower-than", 0)
        await self.redis.config_set("slowlog-max-len", 1_000_000)
        await self.redis.execute_command("CONFIG", "RESETSTAT")
        await self.redis.execute_command("SLOWLOG", "RESET")
        return await self._cpu()

    async def _cpu(self) -> float:
        info = await self.redis.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    async def stop(self, phase: Phase, cpu0: float, exclude: tuple[str, ...] = ()) -> Phase:
        """Fill ``phase`` from the counters; commands in ``exclude`` (lower case) were
        the benchmark's own (e.g. the XADDs feeding a consume phase)."""
        phase.cpu_us = (await self._cpu() - cpu0) * 1e6
        stats = await self.redis.info("commandstats")
        entries = await self.redis.execute_command("SLOWLOG", "GET", -1)
        skip = PROBE | set(exclude)
        for key, value in stats.items():
            name = key.removeprefix("cmdstat_")
            if name.split("|")[0] in skip:
                continue
            phase.commands[name] = {
                "calls": int(value["calls"]),
                "usec_per_call": float(value["usec_per_call"]),
            }
        for entry in entries:
            args = [a.decode(errors="replace") if isinstance(a, bytes) else str(a)
                    for a in entry[3]]  # fmt: skip
            command = args[0].lower()
            if command in skip:
                continue
            kind = command.upper()
            if command in ("evalsha", "eval") and len(args) > 1:
                script = self.by_sha.get(args[1]) or self.by_body.get(args[1][:60], "?")
                kind = f"{script}.lua"
            elif command in ("xinfo", "xgroup", "client", "config") and len(args) > 1:
                kind = f"{kind} {args[1].upper()}"
            phase.calls.setdefault(kind, []).append(int(entry[2]))
        phase.excluded = exclude
        return phase


# -- the data plane ------------------------------------------------------------------------
async def _shards(redis: Any, stream: str, group: str | None = None) -> list[Any]:
    """The stream's shard keys created the streamworks way (+ ``group`` on them)."""
    from streamworks.coordinator.provision import create_group, create_shards
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    shards = [ShardId(stream, i) for i in range(SHARDS)]
    await create_shards(Scripts(redis), Keyspace(PREFIX), shards, [])
    if group is not None:
        await create_group(Scripts(redis), Keyspace(PREFIX), shards, group, "earliest")
    return shards


async def publish_phases(probe: Probe, url: str, n: int) -> list[Phase]:
    """``app.publish`` (with and without an event id) and ``app.publish_many``."""
    from publish import _NoCoordinator

    from streamworks import App, Record, Settings
    from streamworks.redis.keyspace import Keyspace
    from streamworks.runtime.connection import open_connection
    from streamworks.runtime.routing import StaticRoutingSource

    out = []
    for name, options, batch in (
        ("publish", {}, 1),
        ("publish-dedup", {"dedup_window": 60.0}, 1),
        ("publish-many", {}, 100),
    ):
        stream = f"p-{name}"
        await _shards(probe.redis, stream)
        settings = Settings(redis_url=url, key_prefix=PREFIX)
        app = App(f"pub-{name}", settings=settings)
        app.stream(stream, shards=SHARDS, **options)
        routing = StaticRoutingSource(Keyspace(PREFIX), {stream: SHARDS})
        async with (
            open_connection(
                app, settings, routing=routing, coordinator=_NoCoordinator(),
                ensure_streams=False,
            ) as conn,
            app.attached(conn),
        ):  # fmt: skip
            dedup = "dedup_window" in options
            await app.publish(stream, {"warm": 1}, key="w", event_id="w" if dedup else None)
            cpu = await probe.start()
            if batch == 1:
                for i in range(n):
                    await app.publish(
                        stream,
                        common.PAYLOAD,
                        key=f"c{i % common.KEYS}",
                        event_id=f"e{i}" if dedup else None,
                    )
            else:
                for base in range(0, n, batch):
                    records = [Record(common.PAYLOAD, key=f"c{i % common.KEYS}")
                               for i in range(base, base + batch)]  # fmt: skip
                    await app.publish_many(stream, records)
            unit = "message" if batch == 1 else f"message (batches of {batch})"
            out.append(await probe.stop(Phase(name, n, unit), cpu))
    return out


async def consume_phase(
    probe: Probe,
    url: str,
    name: str,
    n: int,
    *,
    fail: int = 0,
    delete_on_ack: bool = False,
    idle: float = 0.0,
) -> Phase:
    """A ``Worker`` owning all shards (fences written, no coordinator) starts and
    consumes ``n`` messages published before (its start-up, a takeover pass over 8
    shards, is in the phase: a few commands per shard); the handler fails the
    first ``fail`` attempts of each message (``fail`` ≥ max attempts: dead letters).
    ``n == 0``: the worker waits on its idle shards for ``idle`` seconds."""
    import anyio

    from streamworks import App, Settings
    from streamworks.redis.client import create_redis
    from streamworks.runtime.retry import RetryPolicy

    stream, group = f"c-{name}", f"g-{name}"
    keys = await _shard_keys(probe.redis, stream, group)
    settings = Settings(redis_url=url, key_prefix=PREFIX)
    redis = create_redis(settings)
    app = App(group, settings=settings)
    app.stream(stream, shards=SHARDS, delete_on_ack=delete_on_ack)
    attempts: dict[str, int] = {}

    @app.handler(stream, retry=RetryPolicy(max_attempts=2, backoff=0.0, jitter=False))
    async def handle(payload: bytes, ctx: Context) -> None:
        if fail:
            seen = attempts[ctx.message.id] = attempts.get(ctx.message.id, 0) + 1
            if seen <= fail:
                raise RuntimeError("fails on purpose")

    worker = await common.owning_worker(app, redis, settings, stream)
    stats = worker.handlers[stream].statistics
    if n:  # published before the worker starts: the phase is the worker's alone
        await _fed(probe, keys, n)
        cpu = await probe.start()
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        if not n:
            await asyncio.sleep(0.3)  # start-up reads (takeover pass) done: shards idle
            cpu = await probe.start()
            await asyncio.sleep(idle)
        deadline = time.monotonic() + 120
        while n and (
            stats.handled + stats.dead_lettered < n
            or (delete_on_ack and sum([await probe.redis.xlen(k) for k in keys]) > 0)
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: {stats.handled} of {n} handled")
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the last ack flush
        if n:
            phase = await probe.stop(Phase(name, n, "message"), cpu)
        else:
            phase = await probe.stop(Phase(name, int(SHARDS * idle), "idle shard-second"), cpu)
        worker.request_stop()
    await redis.aclose()
    return phase


async def _fed(probe: Probe, keys: list[str], n: int) -> None:
    """``n`` entries in the streamworks format, round-robin over ``keys``."""
    data = common.payload_bytes()
    await common.xadd_pipelined(
        probe.redis,
        ((keys[i % SHARDS], ("v", data, "t", "0", "f", "1", "k", f"c{i}")) for i in range(n)),
    )


async def _shard_keys(redis: Any, stream: str, group: str) -> list[str]:
    from streamworks.redis.keyspace import Keyspace

    return [Keyspace(PREFIX).stream(s) for s in await _shards(redis, stream, group)]


# -- the control plane ---------------------------------------------------------------------
async def control_phases(probe: Probe, url: str, members: int, beats: int) -> list[Phase]:
    """A ``CoordinatorService`` (what the HTTP API calls): members join one at a time
    (each a full road: group commit, fences), then no-change heartbeats (short road);
    then fence writes and the positions read of a lag-repair pass."""
    from streamworks.coordinator.provision import write_fence
    from streamworks.coordinator.service import CoordinatorService
    from streamworks.protocol.control import HeartbeatRequest
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.client import create_redis
    from streamworks.settings import Settings

    settings = Settings(redis_url=url, key_prefix=f"{PREFIX}cp", lease_ttl=600)
    redis = create_redis(settings)
    service = CoordinatorService(redis, settings, replica="bench")
    await service.create_stream("cp", 64)
    state: dict[str, tuple[int, list[str]]] = {}

    async def beat(member: str) -> None:
        epoch, owned = state.get(member, (0, []))
        answer = await service.heartbeat(
            "cpg",
            HeartbeatRequest(
                member_id=member,
                member_epoch=epoch,
                metadata_version=0,
                subscriptions=["cp"] if epoch == 0 else None,
                owned_shards=owned,
            ),
        )
        revoked = set(answer.revoke)
        state[member] = (answer.member_epoch, sorted({g.shard for g in answer.assigned} - revoked))

    ids = [f"m{i:03d}" for i in range(members)]
    await beat("m-warm")
    out = []
    cpu = await probe.start()
    for member in ids:  # one at a time: each join is one critical section
        await beat(member)
    out.append(await probe.stop(Phase("join", members, "join (full-road heartbeat)"), cpu))
    for _ in range(20):  # settle: every member holds its target
        for member in [*ids, "m-warm"]:
            await beat(member)
    cpu = await probe.start()
    for i in range(beats):
        await beat(ids[i % members])
    out.append(await probe.stop(Phase("heartbeat", beats, "no-change heartbeat"), cpu))

    fences = [ShardId("cp", i) for i in range(64)]
    cpu = await probe.start()
    for i in range(beats):
        await write_fence(service.store.scripts, service.store.keyspace, fences[i % 64], "cpg",
                          1000 + i, "fencer")  # fmt: skip
    out.append(await probe.stop(Phase("fence", beats, "owner-fence write"), cpu))

    shards = [ShardId("cp", i) for i in range(64)]
    passes = max(1, beats // 64)
    cpu = await probe.start()
    for _ in range(passes):
        await service.store.shard_positions(shards)
    out.append(await probe.stop(Phase("lag-read", passes * 64, "shard (XLEN + XINFO)"), cpu))
    await redis.aclose()
    return out


# -- the suite -----------------------------------------------------------------------------
async def run_suite(suite: common.Suite, args: argparse.Namespace) -> dict[str, Any]:
    # The retry and dead-letter phases fail on purpose: no log line per message.
    logging.getLogger("streamworks").setLevel(logging.CRITICAL)
    probe = Probe(suite.redis)
    n, small = args.messages, max(100, args.messages // 10)
    try:
        phases = await publish_phases(probe, suite.url, small)
        phases.append(await consume_phase(probe, suite.url, "consume", n))
        phases.append(
            await consume_phase(probe, suite.url, "consume-delete", n, delete_on_ack=True)
        )
        phases.append(await consume_phase(probe, suite.url, "retry", small, fail=1))
        phases.append(await consume_phase(probe, suite.url, "dead-letter", small, fail=2))
        phases.append(await consume_phase(probe, suite.url, "idle", 0, idle=args.idle))
        phases += await control_phases(probe, suite.url, args.members, args.heartbeats)
    finally:  # the suites after this one run on a server that logs nothing again
        await suite.redis.config_set("slowlog-log-slower-than", 10_000)
        await suite.redis.config_set("slowlog-max-len", 128)
        await suite.redis.execute_command("SLOWLOG", "RESET")
    results = {"op_costs": {p.name: p.row() for p in phases}}
    print_results(results)
    return results


def print_results(results: dict[str, Any]) -> None:
    rows = results["op_costs"]
    common.print_table(
        "server cost per operation (embedded server; SLOWLOG and INFO cpu)",
        ["operation", "unit", "ops", "server µs/op", "server CPU µs/op"],
        [
            (name, r["unit"], r["ops"], r["server_us_per_op"], r["cpu_us_per_op"])
            for name, r in rows.items()
        ],
        caption="server µs/op: Σ calls per op × median SLOWLOG µs per call (execution inside "
        "the server); server CPU: INFO cpu over the phase / ops (with reading requests and "
        "writing replies; 10 ms resolution)",
    )
    for name, r in rows.items():
        parts = ", ".join(
            f"{kind} {p['per_op']:g}× {p['median_us']:g} µs"
            for kind, p in list(r["parts"].items())[:8]
            if p["median_us"] > 0  # a script's own commands are logged with 0 µs
        )
        print(f"  {name}: {parts}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument("--messages", type=int, default=50_000, help="consume phases (default 50000)")
    p.add_argument("--members", type=int, default=50, help="joins (default 50)")
    p.add_argument("--heartbeats", type=int, default=2_000, help="no-change heartbeats")
    p.add_argument("--idle", type=float, default=5.0, help="seconds of the idle phase")
    p.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    return p


def main() -> None:
    args = parser().parse_args()
    if args.quick:
        args.messages, args.members, args.heartbeats, args.idle = 2_000, 10, 200, 2.0
    common.standalone(run_suite, args)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
