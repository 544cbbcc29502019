"""The fault kinds of issue 18, as a mixin of :class:`~tests.chaos.harness.ChaosRun`:
a coordinator replica paused mid-request, heartbeats held / duplicated / reordered
by the HTTP proxy in front of a replica (``tests/chaos/http_proxy.py``), and a Redis
failover after replication lag (``tests/chaos/failover.py``). Kept apart from the
harness so that each fault is one method here, named ``_f_<kind>``.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

import anyio

from tests.chaos.failover import RedisPair
from tests.chaos.proxy import ProxyHub
from tests.chaos.schedule import Fault

if TYPE_CHECKING:
    from tests.chaos.harness import Replica

__all__ = ("NewFaults", "http_proxy_name")

#: How long a pause waits for a request to be inside the replica before it stops it
#: anyway (heartbeats arrive every 200 ms per worker: this is seldom reached).
IN_FLIGHT_WAIT = 5.0


def http_proxy_name(replica: str) -> str:
    return f"http.{replica}"


class NewFaults:
    """Methods ``_f_coordinator_pause``, ``_f_http_*``, ``_f_redis_failover``."""

    # Provided by ChaosRun.
    hub: ProxyHub
    replicas: list[Replica]
    coordinator_lock: anyio.Lock
    redis_lock: anyio.Lock
    pair: RedisPair | None
    acl_refused: list[dict[str, str]]
    paused_in_flight: int

    if TYPE_CHECKING:

        def say(self, text: str) -> None: ...
        def _window(self, fault: Fault, start: float, pids: tuple[int, ...] = ()) -> None: ...
        async def _acl_log(self) -> list[dict[str, str]]: ...

    def fault_rows(self) -> list[tuple[str, str]]:
        """The report's lines on these faults: what they really did."""
        http = [p.stats for p in self.hub.http.values()]
        rows = [
            (
                "coordinator pauses that caught a request inside the replica",
                str(self.paused_in_flight),
            ),
            (
                "HTTP requests to the replicas: held / duplicated / reordered",
                f"{sum(s.held for s in http)} / {sum(s.duplicated for s in http)} / "
                f"{sum(s.reordered for s in http)}",
            ),
            (
                "  whose sender gave up before the answer (delivered all the same)",
                str(sum(s.client_left for s in http)),
            ),
        ]
        pair = self.pair
        if pair is not None:
            lost = f"{pair.lossy_failovers} of {pair.failovers} / {pair.lost_bytes}"
            rows.append(("Redis failovers: that lost writes / replication bytes lost", lost))
        return rows

    async def _f_coordinator_pause(self, fault: Fault) -> None:
        replica = next(r for r in self.replicas if r.name == fault.target)
        proxy = self.hub.http[http_proxy_name(replica.name)]
        async with self.coordinator_lock:
            assert replica.proc is not None
            proc = replica.proc
            for _ in range(int(IN_FLIGHT_WAIT / 0.005)):
                if proxy.in_flight:
                    break
                await anyio.sleep(0.005)  # polling the proxy's counter, with a deadline
            inside = proxy.in_flight
            start = time.monotonic()
            proc.send(signal.SIGSTOP)
            self.paused_in_flight += inside > 0
            seconds = fault.params["seconds"]
            self.say(
                f"{fault.kind} {replica.name} (pid {proc.pid}) for {seconds}s "
                f"with {inside} request(s) inside"
            )
            try:
                await anyio.sleep(seconds)
            finally:
                proc.send(signal.SIGCONT)
                self._window(fault, start, (proc.pid,))

    async def _http(self, fault: Fault) -> None:
        name = http_proxy_name(fault.target)
        kind = fault.kind.removeprefix("http-")
        start = time.monotonic()
        await self.hub.http_fault(name, kind, fault.params["seconds"], fault.params["for"])
        self.say(
            f"{fault.kind} {fault.target}: {fault.params['seconds']}s for {fault.params['for']}s"
        )
        # The requests it held are delivered up to ``seconds`` after the window.
        await anyio.sleep(fault.params["for"] + fault.params["seconds"])
        self._window(fault, start)

    async def _f_http_hold(self, fault: Fault) -> None:
        await self._http(fault)

    async def _f_http_duplicate(self, fault: Fault) -> None:
        await self._http(fault)

    async def _f_http_reorder(self, fault: Fault) -> None:
        await self._http(fault)

    async def _f_redis_failover(self, fault: Fault) -> None:
        assert self.pair is not None, "redis-failover needs --replica"
        async with self.redis_lock:
            # ACL LOG lives in memory: read the primary's before it is killed.
            self.acl_refused += await self._acl_log()
            times: dict[str, Any] = await self.pair.failover_after_lag(
                fault.params["lag"], fault.params["down"]
            )
            self.windows_failover.append(times)
            self._window(fault, times["began"])

    windows_failover: list[dict[str, Any]]
