"""The fault schedule of a chaos run, drawn from a seed.

:func:`make_schedule` turns ``(seed, duration, topology)`` into a list of
:class:`Fault` — what happens, to whom, when (seconds from the start of the fault
phase) and with which parameters. The same arguments always give the same schedule,
so a failing run is replayed with ``--seed``; the harness prints it at the start.

Kinds:

==========================  ===============================================================
``worker-kill``             SIGKILL a worker; start a new process in its slot ``down`` s later
``worker-pause``            SIGSTOP a worker for ``seconds`` (some shorter than the member
                            lease, some longer), then SIGCONT
``worker-term``             SIGTERM a worker (graceful stop), restart it ``down`` s later
``coordinator-kill``        SIGKILL one coordinator replica, restart it ``down`` s later
``coordinator-rolling``     rolling restart: SIGTERM replica A, start it again, wait until
                            ready; then the same for B
``redis-restart``           SIGKILL Redis (AOF, ``appendfsync always``), start it again
                            ``down`` s later on the same port and data
``cut-redis``               cut a worker's (or the producers') connections to Redis for
                            ``seconds`` (live connections reset, new ones refused)
``cut-coordinator``         cut a worker's connections to both coordinator replicas
``delay-redis``             add ``ms`` of latency on a worker's Redis path for ``seconds``
``delay-coordinator``       add ``ms`` of latency on a worker's coordinator path
``scale``                   change the stream's shard count to ``shards`` (out or in)
``coordinator-pause``       SIGSTOP one coordinator replica once requests are in flight
                            inside it, SIGCONT ``seconds`` later
``http-hold``               for ``for`` s, hold every request to one replica ``seconds``
                            (delivered even after its sender gave up: a stale request)
``http-duplicate``          for ``for`` s, deliver every request to one replica twice (the
                            copy up to ``seconds`` later)
``http-reorder``            for ``for`` s, delay every request to one replica by a random
                            time up to ``seconds`` (later requests overtake earlier ones)
``redis-failover``          (``--replica`` only) hold the replication link ``lag`` s, SIGKILL
                            the primary, promote the stale replica, repoint every proxy;
                            the old primary rejoins as a replica ``down`` s later
==========================  ===============================================================

Constraints that keep the run meaningful: one fault at a time per worker slot; at most
half of the workers under a fault at once; at most one coordinator replica down; one
Redis restart at a time, with room between them; a scale at most every 20 s.
Latency on a worker's Redis path stays under 60 ms: the checker reads a shard's owner
fence in the handler's first Redis write, and the runtime stops handlers one heartbeat
interval (200 ms here) before its lease ends, so a larger delay would make a handler
entered in time *look* late.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ("KINDS", "Fault", "format_schedule", "kinds", "make_schedule")

#: Kind -> relative weight in a long run.
KINDS: dict[str, float] = {
    "worker-kill": 3,
    "worker-pause": 3,
    "worker-term": 2,
    "coordinator-kill": 1.5,
    "coordinator-rolling": 1,
    "redis-restart": 0.7,
    "cut-redis": 3,
    "cut-coordinator": 2.5,
    "delay-redis": 1.5,
    "delay-coordinator": 1.5,
    "scale": 1.2,
    "coordinator-pause": 1.2,
    "http-hold": 1.5,
    "http-duplicate": 1.5,
    "http-reorder": 1.5,
    "redis-failover": 2.0,
}
#: Kinds that need the primary+replica pair (``replicated``).
PAIR_KINDS = ("redis-failover",)


def kinds(replicated: bool) -> list[str]:
    """The kinds a run draws from."""
    return [k for k in KINDS if replicated or k not in PAIR_KINDS]


@dataclass(frozen=True)
class Fault:
    """One scheduled fault."""

    at: float  # seconds after the start of the fault phase
    kind: str
    target: str  # "w2", "producers", "coordinator-a", "coordinators", "redis", "stream"
    params: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"t+{self.at:7.2f}s {self.kind:<20} {self.target:<14} {extra}".rstrip()


def _round(x: float) -> float:
    return round(x, 2)


def make_schedule(
    seed: int,
    duration: float,
    *,
    workers: int,
    shards: int,
    min_shards: int = 2,
    max_shards: int = 8,
    gap: tuple[float, float] = (3.0, 8.0),
    cover_all: bool = False,
    replicated: bool = False,
) -> list[Fault]:
    """The faults of one run (see the module docstring).

    Args:
        seed: the seed; the same arguments give the same schedule.
        duration: length of the fault phase (s); no fault starts after
            ``duration - 5``.
        workers: worker slots (``w0`` …).
        shards: the stream's shard count at the start.
        gap: range of the pause between the starts of consecutive faults (s).
        cover_all: begin with one fault of every kind (shuffled), as far as the
            duration allows — for short runs that must exercise each kind.
        replicated: Redis is a primary+replica pair (``redis-failover`` faults).
    """
    names = kinds(replicated)
    rng = random.Random(seed)
    faults: list[Fault] = []
    busy: dict[str, float] = {}  # resource -> busy until (schedule time)
    count = shards
    last_scale = -1e9
    last_redis = -1e9
    # cover_all: every kind once, plus both sides of the lease for pauses and cuts.
    forced = [*names, "worker-pause:long", "cut-coordinator:long"] if cover_all else []
    rng.shuffle(forced)
    t = rng.uniform(*gap) / 2
    while t < duration - 5:
        free_workers = [f"w{i}" for i in range(workers) if busy.get(f"w{i}", 0) <= t]
        under_fault = workers - len(free_workers)
        worker_ok = bool(free_workers) and under_fault < max(1, workers // 2)

        producers_free = busy.get("producers", 0) <= t
        coordinators_free = busy.get("coordinators", 0) <= t
        allowed = {
            "worker-kill": worker_ok,
            "worker-pause": worker_ok,
            "worker-term": worker_ok,
            "coordinator-kill": coordinators_free,
            "coordinator-rolling": coordinators_free,
            "redis-restart": busy.get("redis", 0) <= t and t - last_redis >= 30,
            "cut-redis": worker_ok or producers_free,
            "cut-coordinator": worker_ok,
            "delay-redis": worker_ok,
            "delay-coordinator": worker_ok,
            "scale": t - last_scale >= 20,
            "coordinator-pause": coordinators_free,
            "redis-failover": busy.get("redis", 0) <= t and t - last_redis >= 30,
        }
        http_free = [r for r in ("coordinator-a", "coordinator-b") if busy.get(r, 0) <= t]
        for kind in ("http-hold", "http-duplicate", "http-reorder"):
            allowed[kind] = bool(http_free)
        variant = ""
        pick = next((k for k in forced if allowed[k.partition(":")[0]]), None)
        if pick is not None:
            forced.remove(pick)
            kind, _, variant = pick.partition(":")
        else:
            choices = [k for k in names if allowed[k]]
            if not choices:
                t += rng.uniform(*gap)
                continue
            kind = rng.choices(choices, weights=[KINDS[k] for k in choices])[0]

        target = ""
        params: dict[str, Any] = {}
        hold = 0.0  # how long the target stays busy (schedule estimate)
        if kind == "cut-redis" and producers_free and (not worker_ok or rng.random() < 0.2):
            target = "producers"
        if kind.startswith(("worker-", "delay-", "cut-")) and not target:
            target = rng.choice(free_workers)
        if kind == "worker-kill":
            params = {"down": _round(rng.uniform(0.5, 4.0))}
            hold = params["down"] + 4
        elif kind == "worker-pause":
            # Half shorter than the 2 s member lease, half well past it.
            long = variant == "long" or (not variant and rng.random() < 0.5)
            seconds = rng.uniform(2.5, 6.0) if long else rng.uniform(0.3, 1.5)
            params = {"seconds": _round(seconds)}
            hold = seconds + 2
        elif kind == "worker-term":
            params = {"down": _round(rng.uniform(0.5, 3.0))}
            hold = params["down"] + 6
        elif kind == "coordinator-kill":
            target = rng.choice(["coordinator-a", "coordinator-b"])
            params = {"down": _round(rng.uniform(0.5, 5.0))}
            hold = params["down"] + 5
        elif kind == "coordinator-rolling":
            target = "coordinators"
            hold = 12
        elif kind == "redis-restart":
            target = "redis"
            params = {"down": _round(rng.uniform(0.3, 3.0))}
            hold = params["down"] + 8
            last_redis = t
        elif kind == "cut-redis":
            params = {"seconds": _round(rng.uniform(0.3, 4.0))}
            hold = params["seconds"] + 1
        elif kind == "cut-coordinator":
            # Some shorter than the lease (heartbeats retried), some longer (lease lost).
            low = 3.0 if variant == "long" else 0.5
            params = {"seconds": _round(rng.uniform(low, 5.0))}
            hold = params["seconds"] + 1
        elif kind == "delay-redis":
            params = {"ms": int(rng.uniform(5, 60)), "seconds": _round(rng.uniform(2, 10))}
            hold = params["seconds"] + 1
        elif kind == "delay-coordinator":
            params = {"ms": int(rng.uniform(50, 700)), "seconds": _round(rng.uniform(2, 10))}
            hold = params["seconds"] + 1
        elif kind == "scale":
            target = "stream"
            options = [n for n in range(min_shards, max_shards + 1) if n != count]
            count = rng.choice(options)
            params = {"shards": count}
            last_scale = t
        elif kind == "coordinator-pause":
            # Shorter and longer than the coordinator's mutex and the member lease.
            target = rng.choice(["coordinator-a", "coordinator-b"])
            params = {"seconds": _round(rng.uniform(0.3, 6.0))}
            hold = params["seconds"] + 3
        elif kind.startswith("http-"):
            target = rng.choice(http_free)
            spread = {"http-hold": (0.3, 3.0), "http-duplicate": (0.0, 1.0)}
            low, high = spread.get(kind, (0.2, 2.0))
            params = {"seconds": _round(rng.uniform(low, high)), "for": _round(rng.uniform(2, 8))}
            hold = params["for"] + 1
        elif kind == "redis-failover":
            target = "redis"
            # The lag stays below coordinator.replica_max_lag (5 s): the replica is one
            # the coordinator waits for, the assumption of docs/cluster.md.
            params = {"lag": _round(rng.uniform(0.3, 3.0)), "down": _round(rng.uniform(0.5, 3.0))}
            hold = params["lag"] + params["down"] + 15
            last_redis = t
        faults.append(Fault(_round(t), kind, target, params))
        resource = (
            "coordinators"
            if kind.startswith("coordinator-")
            else target
            if target not in ("stream", "")
            else kind
        )
        busy[resource] = t + hold
        t += rng.uniform(*gap)
    return faults


def format_schedule(faults: list[Fault]) -> str:
    return "\n".join(str(f) for f in faults)
