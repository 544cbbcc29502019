"""The HTTP endpoints the deployment files rely on, asked of real processes: the
worker's probe and metrics port (one isolated test, skipped until `streamworks worker`
has it) and the coordinator's lag gauge that KEDA scales on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamworks import App, Settings
from streamworks.testing import TestRuntime
from tests.deploy.support import (
    DEPLOY,
    LAG_METRIC,
    ROOT,
    WORKER_HTTP_ENV,
    WORKER_HTTP_FLAGS,
    WORKER_HTTP_PATHS,
    WORKER_HTTP_PORT,
    check_command_line,
    compose,
    k8s_resource,
    load_yaml_documents,
    option_default,
    option_names,
    resolve_command,
    setting_env_names,
    settings_from_env,
    worker_has_http,
)
from tests.deploy.test_dockerfile import env_of_final_stage
from tests.support import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_container() -> dict[str, Any]:
    deployment = k8s_resource("Deployment", "streamworks-worker")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def lag_app(name: str) -> App:
    app = App(name)
    app.stream("events", shards=2)

    @app.handler("events")
    async def handle(value: dict[str, int]) -> None:
        pass

    return app


async def test_worker_http_endpoint_matches_the_deployment(
    streamworks_redis_url: str, tmp_path: Path
) -> None:
    """The worker's --http-port default is the port the Dockerfile exposes, k8s probes
    and Prometheus scrapes; a real worker answers /livez, /readyz and /metrics there."""
    if not worker_has_http():
        pytest.skip("worker HTTP endpoint not available yet")
    command, _, _ = resolve_command(["worker"])
    assert set(WORKER_HTTP_FLAGS) <= option_names(command)
    assert setting_env_names() >= WORKER_HTTP_ENV
    # The port and host come from the worker settings unless the flags say otherwise.
    default = option_default(command, "--http-port")  # None/unset: the setting decides
    assert not isinstance(default, int) or default == WORKER_HTTP_PORT
    image = settings_from_env(env_of_final_stage())
    assert image.worker.http_port == WORKER_HTTP_PORT
    assert image.worker.http_host == "0.0.0.0"  # the kubelet and Prometheus reach it
    for service in ("worker",):
        check_command_line(compose()["services"][service]["command"])
    check_command_line(worker_container()["args"])

    container = worker_container()
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": WORKER_HTTP_PORT}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}
    annotations = k8s_resource("Deployment", "streamworks-worker")["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert (annotations["prometheus.io/port"], annotations["prometheus.io/path"]) == (
        str(WORKER_HTTP_PORT),
        "/metrics",
    )
    [prometheus] = load_yaml_documents(DEPLOY / "prometheus" / "prometheus.yml")
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    [dns] = jobs["streamworks-worker"]["dns_sd_configs"]
    assert dns == {**dns, "names": ["worker"], "port": WORKER_HTTP_PORT}
    assert jobs["streamworks-worker"]["metrics_path"] == "/metrics"
    assert "--no-http" not in compose()["services"]["worker"]["command"]

    # A real worker process, on a port of its own, joined to a real coordinator.
    app = lag_app("deploy-http")
    port = free_port()
    # Production timers on the coordinator too: the worker process runs with them, and a
    # lease granted on the test runtime's fast timers would run out at once.
    async with TestRuntime(
        app, workers=0, http=True, redis_url=streamworks_redis_url, settings=Settings()
    ) as rt:
        assert rt.http_url is not None
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "STREAMWORKS_REDIS_URL": streamworks_redis_url,
            "STREAMWORKS_KEY_PREFIX": rt.settings.key_prefix,
            "STREAMWORKS_COORDINATOR_URLS": rt.http_url,
        }
        target = "tests.deploy.test_endpoints:WORKER_APP"
        log = tmp_path / "worker.log"
        with log.open("wb") as output:
            proc = await anyio.open_process(
                [sys.executable, "-m", "streamworks", "worker", target, "--http-port", str(port)],
                env=env,
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

                async def answers() -> bool:
                    assert proc.returncode is None, log.read_text()
                    try:
                        replies = [await http.get(path) for path in WORKER_HTTP_PATHS]
                    except httpx.TransportError:
                        return False
                    return all(r.status_code == 200 for r in replies)

                await wait_for(answers, 30, "the worker's /livez, /readyz and /metrics")
        finally:
            proc.terminate()
            with anyio.fail_after(40):
                await proc.wait()


WORKER_APP = lag_app("deploy-http")


async def test_keda_lag_query_metric_exists(streamworks_redis_url: str) -> None:
    """The ScaledObject sums streamworks_coordinator_shard_lag{group,stream} by shard: the real
    coordinator exports it with those labels, and it counts unread entries."""
    app = lag_app("deploy-lag")
    async with TestRuntime(app, workers=1, http=True, redis_url=streamworks_redis_url) as rt:
        await rt.stop_worker(0)
        for n in range(7):
            await app.publish("events", {"n": n}, key=f"k{n}")

        async with httpx.AsyncClient(base_url=str(rt.http_url)) as http:

            async def lag() -> float | None:
                text = (await http.get("/metrics")).text
                families = {f.name: f for f in text_string_to_metric_families(text)}
                family = families.get(LAG_METRIC)
                if family is None:
                    return None
                samples = [s for s in family.samples if s.labels.get("group") == app.name]
                for sample in samples:
                    assert {"group", "stream", "shard"} <= set(sample.labels), sample
                return sum(s.value for s in samples if s.labels["stream"] == "events")

            first = await lag()
            if first is None:
                pytest.skip(f"coordinator lag metric {LAG_METRIC} not available yet")

            async def seven() -> bool:
                return await lag() == 7

            await wait_for(seven, 10, f"{LAG_METRIC} to count the 7 unread entries")
