"""The worker's HTTP endpoint, on real processes: /metrics, /livez, /readyz, --no-http."""

from __future__ import annotations

import re
import signal
import socket

import httpx

from tests.e2e.harness import (
    GROUP,
    STREAM,
    Cluster,
    create_stream,
    event,
    free_port,
    producer_app,
    wait_ready,
    wait_stable,
    wait_until,
)

#: The series a dashboard can rely on (docs/operations.md).
NAMES = (
    "streamworks_messages_handled_total",
    "streamworks_messages_failed_total",
    "streamworks_messages_retried_total",
    "streamworks_messages_dead_lettered_total",
    "streamworks_messages_skipped_total",
    "streamworks_handler_duration_seconds",
    "streamworks_messages_in_flight",
    "streamworks_read_batch_size",
    "streamworks_ack_flush_seconds",
    "streamworks_lease_remaining_seconds",
    "streamworks_shards_owned",
    "streamworks_shard_pending",
    "streamworks_shard_lag",
    "streamworks_publish_total",
    "streamworks_publish_seconds",
    "process_cpu_seconds_total",
    "python_info",
)


def samples(text: str, name: str, **labels: str) -> list[float]:
    """The values of the samples of ``name`` carrying ``labels``."""
    out = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            out.append(float(line.rsplit(" ", 1)[1]))
    return out


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample of ``name`` carrying ``labels``, or None."""
    found = samples(text, name, **labels)
    return found[0] if found else None


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=2) as http:
        return await http.get(url)


async def test_metrics_livez_and_readyz_of_a_worker_process(cluster: Cluster) -> None:
    """/metrics counts what the worker handled; /readyz is 200 once assigned and 503
    after the coordinator was SIGKILLed and the lease ran out; /livez stays 200."""
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    port = free_port()
    worker = cluster.start_worker("worker", args=["--http-port", str(port)])
    base = f"http://127.0.0.1:{port}"
    async with cluster.client() as client:
        await wait_stable(client, 1)

    async def ready() -> bool:
        return (await get(f"{base}/readyz")).status_code == 200

    await wait_until(ready, 10, "/readyz 200 once assigned")
    assert (await get(f"{base}/livez")).status_code == 200

    app = producer_app(cluster)
    async with app.connect():
        await app.publish_many(STREAM, [event(f"m-{i:04d}") for i in range(30)])

    async def handled() -> str | None:
        text = (await get(f"{base}/metrics")).text
        n = sample(text, "streamworks_messages_handled_total", group=GROUP, stream=STREAM)
        # Counted when the handler returns; pending drops once the ack is flushed.
        pending = samples(text, "streamworks_shard_pending", group=GROUP)
        return text if n == 30 and len(pending) == 6 and not any(pending) else None

    text = await wait_until(handled, 20, "30 messages handled and acked on 6 shards")
    for name in NAMES:  # described even with no sample yet (this worker publishes nothing)
        assert re.search(rf"^# HELP {name} ", text, re.M), name
    assert sample(text, "streamworks_shards_owned", group=GROUP) == 6
    lease = sample(text, "streamworks_lease_remaining_seconds", group=GROUP)
    assert lease is not None and lease > 0
    count = sample(text, "streamworks_handler_duration_seconds_count", stream=STREAM)
    assert count == 30
    assert samples(text, "streamworks_shard_lag", group=GROUP) == [0.0] * 6

    coordinator.send(signal.SIGKILL)
    await coordinator.wait_exit(10)

    async def not_ready() -> httpx.Response | None:
        response = await get(f"{base}/readyz")
        return response if response.status_code == 503 else None

    # The lease is 2 s (FAST_TIMERS): wait on the condition, bounded well above it.
    response = await wait_until(not_ready, 15, "/readyz 503 after the lease ran out")
    assert "lease expired" in response.text
    assert (await get(f"{base}/livez")).status_code == 200
    text = (await get(f"{base}/metrics")).text
    assert sample(text, "streamworks_lease_remaining_seconds", group=GROUP) == 0
    assert worker.alive()


async def test_no_http_opens_no_port(cluster: Cluster) -> None:
    """With --no-http the worker joins and works, and nothing listens on the port."""
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    port = free_port()
    worker = cluster.start_worker("worker", args=["--no-http", "--http-port", str(port)])
    async with cluster.client() as client:
        await wait_stable(client, 1)
    assert worker.alive()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "something listens on the port"
    assert "no HTTP endpoint" in worker.output()


async def test_a_taken_port_is_one_error_line(cluster: Cluster) -> None:
    """A port already in use: one error line and a non-zero exit, before joining."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        worker = cluster.start_worker("worker", args=["--http-port", str(port)])
        code = await worker.wait_exit(20)
        # Chosen in the environment instead of by the flag: the same.
        by_env = cluster.start_worker("by-env", STREAMWORKS_WORKER__HTTP_PORT=str(port))
        env_code = await by_env.wait_exit(20)
    assert code == 2 and env_code == 2  # as the coordinator's --port (docs/cli.md)
    for proc in (worker, by_env):
        lines = proc.output().strip().splitlines()
        assert lines[-1].startswith("error: cannot serve the worker's HTTP endpoint"), lines
        assert f"127.0.0.1:{port}" in lines[-1]
        assert "Traceback" not in proc.output()


async def test_a_second_worker_on_a_host_takes_another_port_and_says_where(
    cluster: Cluster,
) -> None:
    """No port chosen and the default taken (a second worker on the host): a free port,
    logged; each member reports its metrics address, and status shows both. (The
    default is 9400; ``--default-http-port``, which the supervisor gives its children,
    stands in for it here, so the test does not depend on 9400 being free.)"""
    cluster.base_env.pop("STREAMWORKS_WORKER__HTTP_PORT")  # nobody chooses the port
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    default = free_port()
    first = cluster.start_worker("first", args=["--default-http-port", str(default)])
    async with cluster.client() as client:
        await wait_stable(client, 1)
        second = cluster.start_worker("second", args=["--default-http-port", str(default)])
        group = await wait_stable(client, 2)
    assert first.alive() and second.alive()
    assert f"metrics at http://127.0.0.1:{default}/metrics" in first.output()
    moved = re.search(
        rf"port {default} is taken \(another worker on this host\?\): serving /metrics, "
        r"/livez and /readyz on (http://127\.0\.0\.1:(\d+)) instead",
        second.output(),
    )
    assert moved is not None, second.output()
    assert int(moved[2]) != default
    urls = sorted(m.client.get("metrics", "") for m in group.members if m.state == "STABLE")
    assert urls == sorted([f"http://127.0.0.1:{default}", moved[1]])
    for url in urls:
        answer = await get(f"{url}/metrics")
        assert answer.status_code == 200 and "streamworks_shards_owned" in answer.text
    shown = await cluster.cli("status", env={"COLUMNS": "250"})
    assert shown.returncode == 0
    for url in urls:
        assert f"{url}/metrics" in shown.stdout.decode()
