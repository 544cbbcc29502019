"""Redis loses its data under a running coordinator (issue 22, item 8): a real server
restarted without persistence. The coordinator says so in one sentence with the fix —
logged at ERROR again and again, ``streamworks_coordinator_namespace_lost`` 1, the
alerts of ``status`` (text and ``--json``), ``/readyz`` failing with it — and a new
worker's namespace error names that cause too, not only a wrong URL.

(Before, workers rejoined and sat idle, ``status`` showed the group STABLE with nothing
assigned, ``/readyz`` was 200, and a new worker was told to use the coordinator's Redis
URL — which it did.)"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from pathlib import Path

import anyio.to_thread
import httpx
import orjson
import pytest

from streamworks.coordinator.identity import REPEAT
from streamworks.testing.embedded import EmbeddedRedis
from tests.e2e.harness import Cluster, create_stream, wait_ready, wait_stable, wait_until
from tests.e2e.test_cli import text

pytestmark = pytest.mark.timeout(120)

LOST = "lost this namespace's data"


@pytest.fixture
async def own_server(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedRedis, Cluster]]:
    """A Redis of this test alone (no AOF, no snapshots: a restart loses everything),
    and processes on it."""
    server = EmbeddedRedis().start()
    cluster = Cluster(server.url, "loss", tmp_path)
    try:
        yield server, cluster
    finally:
        cluster.kill_all()
        print(cluster.report())
        server.stop()


async def test_the_coordinator_says_loudly_that_redis_lost_its_data(
    own_server: tuple[EmbeddedRedis, Cluster],
) -> None:
    server, cluster = own_server
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    cluster.start_worker("first")
    async with cluster.client() as client:
        await wait_stable(client, 1)
        assert (await client.status()).alerts == []

    await anyio.to_thread.run_sync(server.restart)  # same port, no persistence: empty

    async def refused() -> str | None:
        async with httpx.AsyncClient(timeout=2) as http:
            answer = await http.get(f"{coordinator.url}/readyz")
        return answer.text if answer.status_code == 503 and LOST in answer.text else None

    body = await wait_until(refused, 20, "/readyz to fail with the reason")
    problem = orjson.loads(body)["message"]
    assert "restart every coordinator replica" in problem and "appendonly" in problem

    # The same sentence in status (the banner) and status --json.
    shown = await cluster.cli("status")
    assert shown.returncode == 0, text(shown)
    assert "ALERT:" in text(shown)[0] and LOST in text(shown)[0], text(shown)[0]
    as_json = await cluster.cli("status", "--json")
    assert orjson.loads(as_json.stdout)["alerts"] == [problem]

    async with httpx.AsyncClient(timeout=2) as http:
        metrics = (await http.get(f"{coordinator.url}/metrics")).text
        panels = (await http.get(f"{coordinator.url}/ui/panels")).text  # the banner
    assert re.search(r"^streamworks_coordinator_namespace_lost 1\.0$", metrics, re.M), metrics
    assert 'class="error banner alert"' in panels, panels[:2000]
    assert problem in html.unescape(panels), panels[:2000]

    # The dashboard's actions refuse, with the producer's namespace error.
    async with httpx.AsyncClient(timeout=5) as http:
        action = await http.post(
            f"{coordinator.url}/ui/streams/events/scale",
            headers={"cookie": "sw_ui_csrf=" + "t" * 43},
            data={"csrf": "t" * 43, "confirm": "yes", "shards": "7"},
        )
    assert action.status_code == 503, action.text
    assert "namespace mismatch" in html.unescape(action.text), action.text

    # Logged at ERROR, and again while it lasts.
    async def logged_twice() -> bool:
        errors = [ln for ln in coordinator.output().splitlines() if "ERROR" in ln and LOST in ln]
        return len(errors) >= 2

    await wait_until(logged_twice, REPEAT + 10, "the ERROR line to repeat", interval=0.5)

    # A new worker's namespace error names the data loss as a cause, not only the URL.
    newcomer = cluster.start_worker("newcomer")
    assert await newcomer.wait_exit(30) != 0
    last = newcomer.output().strip().splitlines()[-1]
    assert last.startswith("error: namespace mismatch"), last
    assert "lost its data" in last and "restart its replicas" in last, last
