"""Helpers of the live-resharding tests.

* :func:`keys_on` — partition keys that the routing protocol (jump hash of xxh64, E17)
  places on a given shard, so a test can put messages exactly where it wants them.
* :class:`DrainWatch` — polls removed shards in Redis, each round one atomic script:
  a number from a shared sequence, then for every shard key whether it exists and,
  if so, every consumer group's ``pending``/``lag`` and the ids still pending or not
  yet delivered. The sequence is the one the instrumented app numbers its handler
  records with (or any counter), so "the key vanished" and "the handler of entry X
  ended" are totally ordered.
* :class:`Probe` — an in-process handler that records what it handled, with optional
  per-shard gates that hold handlers back (keeps a removed shard's entries pending).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from streamworks import App, Message
from streamworks.protocol.control import StreamInfo
from streamworks.runtime.routing import jump_hash, key_hash

__all__ = (
    "DrainWatch",
    "Observation",
    "Probe",
    "blocked",
    "draining",
    "fence_of",
    "keys_on",
    "phase",
    "probe_app",
    "redis_now_ms",
    "retired",
)


def keys_on(index: int, count: int, n: int = 1, stem: str = "key") -> list[str]:
    """``n`` partition keys that route to shard ``index`` of ``count`` (E17)."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        key = f"{stem}-{i}"
        if jump_hash(key_hash(key), count) == index:
            out.append(key)
        i += 1
    return out


def phase(info: StreamInfo) -> str:
    """The migration phase the coordinator reports (``NONE`` without a migration)."""
    return str((info.migration or {}).get("phase", "NONE"))


def draining(info: StreamInfo) -> list[str]:
    return sorted(s.shard for s in info.shards if s.state == "DRAINING")


def fence_of(info: StreamInfo) -> int:
    """The routing fence (Redis time, ms) recorded by the stream's migration."""
    assert info.migration is not None
    return int(str(info.migration["routing_fence_ms"]))


def retired(info: StreamInfo) -> list[str]:
    """Shards the stream's migrations retired, sorted."""
    raw = (info.migration or {}).get("retired") or []
    assert isinstance(raw, list)
    return sorted(str(s) for s in raw)


def blocked(info: StreamInfo) -> dict[str, str]:
    """Why each draining shard is not retired yet (the coordinator's last check)."""
    raw = (info.migration or {}).get("blocked") or {}
    assert isinstance(raw, dict)
    return {str(k): str(v) for k, v in raw.items()}


async def redis_now_ms(redis: Any) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


# -- watching removed shards -------------------------------------------------------------
# KEYS[1] the sequence; KEYS[2..] shard stream keys.
# Returns {seq, per key: 0 (gone) | {1, {{group, pending, lag or -1, {ids}}, ...}}}; the
# ids are the group's pending entries and the entries after its last-delivered-id.
_OBSERVE = """
local seq = redis.call('INCR', KEYS[1])
local out = {seq}
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    out[#out + 1] = 0
  else
    local gs = {}
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[i])) do
      local f = {}
      for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
      local ids = {}
      if f['pending'] > 0 then
        for _, p in ipairs(redis.call('XPENDING', KEYS[i], f['name'], '-', '+', 1000)) do
          ids[#ids + 1] = p[1]
        end
      end
      local rest = redis.call('XRANGE', KEYS[i], '(' .. f['last-delivered-id'], '+', 'COUNT', 1000)
      for _, e in ipairs(rest) do ids[#ids + 1] = e[1] end
      gs[#gs + 1] = {f['name'], f['pending'], f['lag'] or -1, ids}
    end
    out[#out + 1] = {1, gs}
  end
end
return out
"""


@dataclass(frozen=True, slots=True)
class GroupState:
    group: str
    pending: int
    lag: int | None  # None: Redis reported nil
    waiting: tuple[str, ...]  # entry ids pending or not yet delivered


@dataclass(frozen=True, slots=True)
class Observation:
    seq: int
    exists: bool
    groups: tuple[GroupState, ...] = ()

    @property
    def drained(self) -> bool:
        return all(g.pending == 0 and g.lag == 0 and not g.waiting for g in self.groups)

    def __str__(self) -> str:
        if not self.exists:
            return f"#{self.seq} gone"
        parts = [f"{g.group} pending={g.pending} lag={g.lag}" for g in self.groups]
        return f"#{self.seq} " + (", ".join(parts) or "no groups")


@dataclass
class DrainWatch:
    """Watch ``keys`` (shard id -> stream key) until every one is gone or
    :meth:`stop`; see the module docstring."""

    redis: Any
    seq_key: str
    keys: Mapping[str, str]
    interval: float = 0.01
    history: dict[str, list[Observation]] = field(default_factory=dict)
    rounds: int = 0

    def __post_init__(self) -> None:
        self.history = {shard: [] for shard in self.keys}
        self._stop = anyio.Event()
        self._script = self.redis.register_script(_OBSERVE)

    async def observe(self) -> None:
        shards = list(self.keys)
        reply = await self._script(keys=[self.seq_key, *(self.keys[s] for s in shards)])
        seq = int(reply[0])
        for shard, item in zip(shards, reply[1:], strict=True):
            seen = self.history[shard]
            if item == 0:
                seen.append(Observation(seq, False))
                continue
            groups = tuple(
                GroupState(
                    g[0].decode(),
                    int(g[1]),
                    None if int(g[2]) == -1 else int(g[2]),
                    tuple(i.decode() for i in g[3]),
                )
                for g in item[1]
            )
            seen.append(Observation(seq, True, groups))
        self.rounds += 1

    async def run(self) -> None:
        while not self._stop.is_set():
            await self.observe()
            if all(self.gone_seq(s) is not None for s in self.history):
                return
            with anyio.move_on_after(self.interval):
                await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

    def gone_seq(self, shard: str) -> int | None:
        """Sequence number of the first round that found the key gone."""
        for o in self.history[shard]:
            if not o.exists:
                return o.seq
        return None

    def last_present(self, shard: str) -> Observation | None:
        """The last round that still found the key (just before it vanished)."""
        gone = self.gone_seq(shard)
        present = [o for o in self.history[shard] if o.exists and (gone is None or o.seq < gone)]
        return present[-1] if present else None

    def recreated(self, shard: str) -> bool:
        """Whether the key was found again after a round found it gone."""
        gone = self.gone_seq(shard)
        return gone is not None and any(o.exists and o.seq > gone for o in self.history[shard])

    def states(self) -> Iterable[tuple[str, Observation]]:
        for shard, seen in self.history.items():
            for o in seen:
                yield shard, o


# -- in-process handlers ------------------------------------------------------------------
class Probe:
    """Records ``(id, shard, entry id)`` of every handled message; a handler of a shard
    in ``gates`` waits for its gate first (its entries stay pending meanwhile)."""

    def __init__(self) -> None:
        self.handled: list[tuple[str, str, str]] = []
        self.gates: dict[str, anyio.Event] = {}
        self.started = 0

    async def handle(self, value: dict[str, Any], msg: Message) -> None:
        self.started += 1
        gate = self.gates.get(msg.shard)
        if gate is not None:
            await gate.wait()
        self.handled.append((str(value["id"]), msg.shard, msg.id))

    def ids(self) -> set[str]:
        return {i for i, _, _ in self.handled}

    def shard_of(self) -> dict[str, str]:
        return {i: shard for i, shard, _ in self.handled}


def probe_app(
    group: str, streams: Mapping[str, int], probe: Probe | None = None, **handler: Any
) -> tuple[App, Probe]:
    """An app of ``group`` handling every stream of ``streams`` (name -> shards) with
    ``probe``."""
    app = App(group)
    probe = probe or Probe()
    for name, shards in streams.items():
        app.stream(name, shards=shards)
        app.handler(name, **handler)(probe.handle)
    return app, probe


async def wait_for(
    probe: Callable[[], Any], timeout: float, message: str, interval: float = 0.02
) -> Any:
    """Poll ``probe`` (sync or async) until it returns something truthy; fail after
    ``timeout`` seconds with what was awaited and the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = probe()
        if hasattr(last, "__await__"):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {last})")
        await anyio.sleep(interval)
