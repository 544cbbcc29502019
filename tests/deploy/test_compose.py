"""deploy/compose.yaml, its Prometheus and Grafana configuration: every streamworks
command, flag, port, path and setting in them is real, and the pieces point at each
other."""

from __future__ import annotations

import importlib.util
import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.deploy.support import (
    DEPLOY,
    ROOT,
    allowed_env_names,
    check_command_line,
    compose,
    coordinator_get_paths,
    load_yaml_documents,
    settings_from_env,
    streamworks_env,
)

DASHBOARD = DEPLOY / "grafana" / "streamworks.json"


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def streamworks_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services().items() if s.get("image") == "streamworks:local"}


def coordinators() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in streamworks_services().items() if s["command"][0] == "coordinator"}


def port_of(service: dict[str, Any]) -> int:
    """The port a coordinator service listens on, as its command and settings say."""
    command = service["command"]
    if "--port" in command:
        return int(command[command.index("--port") + 1])
    return settings_from_env(service["environment"]).coordinator.port


def prometheus() -> dict[str, Any]:
    [doc] = load_yaml_documents(DEPLOY / "prometheus" / "prometheus.yml")
    return doc


def test_services() -> None:
    assert {"redis", "worker", "prometheus", "grafana"} <= set(services())
    assert len(coordinators()) == 2
    for name, service in services().items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services(), f"{name} depends on unknown {dependency}"


def test_streamworks_services_build_the_repository_image() -> None:
    for service in streamworks_services().values():
        build = service["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"


@pytest.mark.parametrize("name", sorted(streamworks_services()))
def test_commands_and_flags_exist(name: str) -> None:
    service = streamworks_services()[name]
    entrypoint = service.get("entrypoint")
    if entrypoint is None:  # the image's: streamworks
        check_command_line(service["command"])
    else:
        assert entrypoint[:2] == ["python", "-m"], entrypoint
        assert importlib.util.find_spec(entrypoint[2]) is not None, entrypoint[2]


@pytest.mark.parametrize("name", sorted(streamworks_services()))
def test_environment_is_settings(name: str) -> None:
    env = streamworks_services()[name]["environment"]
    unknown = set(streamworks_env(env)) - allowed_env_names()
    assert not unknown, f"{name}: not streamworks settings: {sorted(unknown)}"
    settings = settings_from_env(env)
    assert settings.token is not None and urlsplit(settings.redis_url).hostname == "redis"
    assert [urlsplit(u).hostname for u in settings.coordinator_urls] == sorted(coordinators())
    for url in settings.coordinator_urls:
        assert urlsplit(url).port == port_of(services()[str(urlsplit(url).hostname)])


async def test_coordinator_healthcheck_and_ports() -> None:
    paths = coordinator_get_paths()
    for name, service in coordinators().items():
        port = port_of(service)
        assert settings_from_env(service["environment"]).coordinator.host == "0.0.0.0", name
        [published] = service["ports"]
        assert published.endswith(f":{port}")
        probe = " ".join(service["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/readyz" in probe
        assert "/readyz" in paths


def test_stop_grace_periods_cover_graceful_shutdown() -> None:
    for name, service in coordinators().items():
        settings = settings_from_env(service["environment"])
        assert seconds(service["stop_grace_period"]) >= 2 * settings.coordinator.mutex_ttl + 5, name
    worker = services()["worker"]
    settings = settings_from_env(worker["environment"])
    assert seconds(worker["stop_grace_period"]) >= settings.worker.shutdown_timeout + 5


def seconds(duration: str) -> float:
    assert duration.endswith("s") and not duration.endswith("ms"), duration
    return float(duration[:-1])


def test_bind_mounts_exist() -> None:
    for name, service in services().items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("."):
                assert source in compose()["volumes"], f"{name}: unknown volume {source}"
                continue
            path = (DEPLOY / source).resolve()
            if path == DASHBOARD:
                continue  # test_grafana_dashboard_is_provisioned
            assert path.exists(), f"{name} mounts {source}, which does not exist"


async def test_prometheus_scrapes_every_coordinator() -> None:
    jobs = {job["job_name"]: job for job in prometheus()["scrape_configs"]}
    coordinator = jobs["streamworks-coordinator"]
    assert coordinator["metrics_path"] in coordinator_get_paths()
    [static] = coordinator["static_configs"]
    assert sorted(static["targets"]) == sorted(
        f"{name}:{port_of(service)}" for name, service in coordinators().items()
    )
    assert services()["prometheus"]["volumes"] == [
        "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro"
    ]


def test_grafana_datasource_is_the_prometheus_service() -> None:
    [doc] = load_yaml_documents(
        DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
    )
    [source] = doc["datasources"]
    assert source["type"] == "prometheus" and source["uid"] == "prometheus"
    url = urlsplit(source["url"])
    assert url.hostname == "prometheus" and url.port == 9090
    assert any(p.endswith(":9090") for p in services()["prometheus"]["ports"])


def test_grafana_dashboard_is_provisioned() -> None:
    [doc] = load_yaml_documents(
        DEPLOY / "grafana" / "provisioning" / "dashboards" / "streamworks.yaml"
    )
    [provider] = doc["providers"]
    mounts = dict(v.split(":")[:2] for v in services()["grafana"]["volumes"])
    assert mounts["./grafana/streamworks.json"].rsplit("/", 1)[0] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    if not DASHBOARD.exists():
        pytest.skip("deploy/grafana/streamworks.json is written by another change")
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {
        target["datasource"]["uid"]
        for panel in dashboard.get("panels", [])
        for target in panel.get("targets", [])
        if isinstance(target.get("datasource"), dict) and "uid" in target["datasource"]
    }
    # The provisioned data source is the only one there is (no ${DS_...} inputs left).
    assert uids <= {"prometheus", "${datasource}"}, uids
