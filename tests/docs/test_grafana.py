"""The Grafana dashboard (``deploy/grafana/streamworks.json``) queries only metrics that
exist: every name in its queries is declared in the ``/metrics`` output of a real
coordinator (``streamworks_coordinator_*``) or of a real worker process (the rest)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamworks import App
from streamworks.settings import Settings
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.e2e.harness import REPO, Cluster, create_stream, free_port, wait_ready, wait_until

DASHBOARD = REPO / "deploy" / "grafana" / "streamworks.json"
METRIC = re.compile(r"\bstreamworks_[a-z0-9_]+\b")
#: The sample names each metric type can expose (text format, prometheus-client).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "untyped": ("",),
}


def _strings(node: Any) -> Iterator[tuple[str, str]]:
    """(key, value) of every string in the JSON tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str):
                yield key, value
            else:
                yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def queried_metrics() -> set[str]:
    """Every metric name in a query of the dashboard (panel targets and variables)."""
    dashboard = json.loads(DASHBOARD.read_text())
    names: set[str] = set()
    for key, value in _strings(dashboard):
        if key in ("expr", "query", "definition"):
            names |= set(METRIC.findall(value))
    return names


def exposed(text: str) -> set[str]:
    """Every sample name a ``/metrics`` text declares (from its ``# TYPE`` lines, so a
    labelled metric with no series yet counts as existing)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            base = family.removesuffix("_total") if kind == "counter" else family
            names |= {base + suffix for suffix in SUFFIXES.get(kind, ("",))}
    return names


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "group", "stream"}
    names = queried_metrics()
    # It covers what an on-call person asks for first.
    for needed in (
        "streamworks_coordinator_group_lag",
        "streamworks_coordinator_target_assignments_total",
        "streamworks_coordinator_migration_phase",
        "streamworks_coordinator_dead_letters",
        "streamworks_messages_handled_total",
        "streamworks_messages_failed_total",
        "streamworks_handler_duration_seconds_bucket",
        "streamworks_lease_remaining_seconds",
    ):
        assert needed in names, needed


@pytest.fixture
async def coordinator_metrics(streamworks_redis_url: str, settings: Settings) -> AsyncIterator[str]:
    app = App("graphed")
    app.stream("orders", shards=2)

    @app.handler("orders")
    async def handle(value: Any) -> None: ...

    async with TestRuntime(
        app, http=True, redis_url=streamworks_redis_url, settings=fast_settings(settings)
    ) as rt:
        await rt.wait_assigned()
        async with httpx.AsyncClient(base_url=rt.http_url) as http:
            response = await http.get("/metrics")
            assert response.status_code == 200
            yield response.text


async def test_every_coordinator_metric_it_queries_exists(coordinator_metrics: str) -> None:
    wanted = {n for n in queried_metrics() if n.startswith("streamworks_coordinator_")}
    assert wanted
    missing = sorted(wanted - exposed(coordinator_metrics))
    assert not missing, f"queried by the dashboard, not in a coordinator's /metrics: {missing}"


def worker_port_flag() -> str | None:
    """The worker command's flag for its HTTP port, if it has one."""
    help_text = subprocess.run(
        [sys.executable, "-m", "streamworks", "worker", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout
    found = re.search(r"--(?:http|metrics)-port\b", help_text)
    return found.group(0) if found else None


async def test_every_worker_metric_it_queries_exists(
    settings: Settings, redis: Any, tmp_path: Path
) -> None:
    flag = worker_port_flag()
    if flag is None:
        pytest.skip("worker /metrics endpoint not available")
    cluster = Cluster(settings.redis_url, settings.key_prefix, tmp_path)
    try:
        coordinator = cluster.start_coordinator()
        await wait_ready(coordinator)
        await create_stream(cluster)
        port = free_port()
        worker = cluster.start_worker("worker", args=[flag, str(port)])

        async def scraped() -> str | None:
            if not worker.alive():
                raise AssertionError(f"the worker exited:\n{worker.output()}")
            async with httpx.AsyncClient(timeout=2) as http:
                response = await http.get(f"http://127.0.0.1:{port}/metrics")
                return response.text if response.status_code == 200 else None

        text = await wait_until(scraped, 30, "the worker's /metrics")
    finally:
        cluster.kill_all()
    wanted = {n for n in queried_metrics() if not n.startswith("streamworks_coordinator_")}
    assert wanted
    missing = sorted(wanted - exposed(text))
    assert not missing, f"queried by the dashboard, not in a worker's /metrics: {missing}"
