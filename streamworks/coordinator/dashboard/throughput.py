"""Per-group handled/s and failure rate, from the members' own ``/metrics``.

Each member reports where it serves its metrics (``CLIENT_METRICS`` in its client
info, ``protocol/control.py``). While someone looks at the dashboard, the replica
reads ``streamworks_messages_handled_total`` and ``streamworks_messages_failed_total``
from every live member (at most once per ``every`` seconds, concurrently, each with a
short timeout and a size cap) and turns two readings of a member into rates; a
group's rate is the sum over its members. A member that cannot be reached (a worker
listening on 127.0.0.1 of another host, ``--no-http``) is counted as such, never
guessed. Nothing here touches Redis.

The URLs come from members, which hold the member token; only ``http``/``https``
URLs are fetched, only their ``/metrics`` path, and only counter lines are read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from streamworks.clock import Clock
from streamworks.protocol.control import CLIENT_METRICS, StatusResponse

__all__ = ("GroupRate", "Throughput", "metrics_url")

log = logging.getLogger("streamworks.coordinator.dashboard")

#: The counters read (summed over a member's handlers).
HANDLED = "streamworks_messages_handled"
FAILED = "streamworks_messages_failed"
#: Largest ``/metrics`` body read from one member.
MAX_BODY = 1 << 20
#: Most members read in one refresh (Grafana is the tool beyond that).
MAX_MEMBERS = 100


def metrics_url(client: Mapping[str, str]) -> str | None:
    """The member's ``/metrics`` URL from its client info, when it is an http(s) one."""
    base = client.get(CLIENT_METRICS)
    if not base or urlsplit(base).scheme not in ("http", "https"):
        return None
    return f"{base.rstrip('/')}/metrics"


@dataclass(frozen=True, slots=True)
class GroupRate:
    """One group's rates over the members that could be read twice."""

    group: str
    handled_per_s: float | None  # None: no member read twice yet
    failed_per_s: float | None
    members: int  # live members
    read: int  # members whose metrics answered this time

    @property
    def failure_rate(self) -> float | None:
        """Failed attempts / (handled + failed), over the last interval."""
        if self.handled_per_s is None or self.failed_per_s is None:
            return None
        total = self.handled_per_s + self.failed_per_s
        return self.failed_per_s / total if total else 0.0


@dataclass(frozen=True, slots=True)
class _Reading:
    at: float
    handled: float
    failed: float


class Throughput:
    """The replica's readings of its members' counters.

    Args:
        clock: monotonic time of the readings.
        every: the least time between two rounds of reading (s).
        timeout: per member (s).
    """

    def __init__(self, clock: Clock, *, every: float = 2.0, timeout: float = 1.0) -> None:
        self.clock = clock
        self.every = every
        self.timeout = timeout
        self._last: dict[str, _Reading] = {}  # member id -> its latest reading
        self._rates: dict[str, tuple[float, float]] = {}  # member id -> (handled/s, failed/s)
        self._read: set[str] = set()
        self._round = float("-inf")
        self._lock = anyio.Lock()

    async def rates(self, status: StatusResponse | None) -> list[GroupRate]:
        """Each group's rates (reading the members first, when a round is due)."""
        if status is None:
            return []
        live = {
            g.group: [m for m in g.members if m.state not in ("EXPIRED", "FENCED")]
            for g in status.groups
        }
        async with self._lock:
            if self.clock.monotonic() - self._round >= self.every:
                self._round = self.clock.monotonic()
                targets = {
                    m.member_id: url
                    for members in live.values()
                    for m in members
                    if (url := metrics_url(m.client)) is not None
                }
                await self._read_all(dict(list(targets.items())[:MAX_MEMBERS]))
        out = []
        for group, members in sorted(live.items()):
            rates = [self._rates[m.member_id] for m in members if m.member_id in self._rates]
            out.append(
                GroupRate(
                    group,
                    sum(r[0] for r in rates) if rates else None,
                    sum(r[1] for r in rates) if rates else None,
                    len(members),
                    sum(1 for m in members if m.member_id in self._read),
                )
            )
        return out

    async def _read_all(self, targets: dict[str, str]) -> None:
        self._read = set()
        async with (
            httpx.AsyncClient(timeout=self.timeout, follow_redirects=False) as http,
            anyio.create_task_group() as tg,
        ):
            for member, url in targets.items():
                tg.start_soon(self._read_one, http, member, url)
        for gone in set(self._last) - set(targets):
            self._last.pop(gone, None)
            self._rates.pop(gone, None)

    async def _read_one(self, http: httpx.AsyncClient, member: str, url: str) -> None:
        try:
            async with http.stream("GET", url) as answer:
                if answer.status_code != 200:
                    return
                body = b""
                async for chunk in answer.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_BODY:
                        return
        except (httpx.HTTPError, OSError) as e:
            log.debug("metrics of member %s at %s: %r", member, url, e)
            return
        handled, failed = _counters(body.decode("utf-8", "replace"))
        now = self.clock.monotonic()
        self._read.add(member)
        previous = self._last.get(member)
        self._last[member] = _Reading(now, handled, failed)
        if previous is not None and now > previous.at:
            dt = now - previous.at
            # A counter that went down is a restarted member: no rate from that pair.
            if handled >= previous.handled and failed >= previous.failed:
                self._rates[member] = (
                    (handled - previous.handled) / dt,
                    (failed - previous.failed) / dt,
                )


def _counters(text: str) -> tuple[float, float]:
    """The member's handled and failed totals, summed over its handlers."""
    handled = failed = 0.0
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return handled, failed
    for family in families:
        if family.name not in (HANDLED, FAILED):
            continue
        total = sum(s.value for s in family.samples if s.name.endswith("_total"))
        if family.name == HANDLED:
            handled += total
        else:
            failed += total
    return handled, failed
