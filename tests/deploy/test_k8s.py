"""The kustomize base in deploy/k8s/base: valid Kubernetes objects whose commands,
flags, ports, paths, settings and timings are the ones streamworks really has."""

from __future__ import annotations

import math
from typing import Any

import kubernetes_validate
import pytest

from streamworks.settings import Settings
from tests.deploy.support import (
    K8S_BASE,
    LAG_METRIC,
    allowed_env_names,
    check_command_line,
    coordinator_get_paths,
    k8s_resource,
    k8s_resources,
    kustomization,
    load_target,
    settings_from_env,
    streamworks_env,
)

#: Kinds that are CustomResourceDefinitions, not in the Kubernetes schemas.
CRD_KINDS = {"ScaledObject"}
KUBERNETES_VERSION = "1.30.0"  # the oldest version still maintained upstream


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    return only


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    """The STREAMWORKS_* environment of the container, with Secret and ConfigMap
    references resolved from the base's own objects."""
    spec = container(deployment)
    env: dict[str, str] = {}
    for ref in spec.get("envFrom", []):
        kind = "ConfigMap" if "configMapRef" in ref else "Secret"
        source = k8s_resource(kind, ref.get("configMapRef", ref.get("secretRef"))["name"])
        env.update(source.get("data") or source.get("stringData") or {})
    for var in spec.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"].get("secretKeyRef") or var["valueFrom"]["configMapKeyRef"]
        kind = "Secret" if "secretKeyRef" in var["valueFrom"] else "ConfigMap"
        source = k8s_resource(kind, ref["name"])
        values = source.get("stringData") or source.get("data") or {}
        assert ref["key"] in values, f"{kind} {ref['name']} has no key {ref['key']}"
        env[var["name"]] = values[ref["key"]]
    return env


def named_port(deployment: dict[str, Any], name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    assert name in ports, f"no container port named {name!r}"
    return int(ports[name])


def deployments() -> list[dict[str, Any]]:
    return [r for r in k8s_resources() if r["kind"] == "Deployment"]


def test_base_lists_every_manifest() -> None:
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in K8S_BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    kinds = sorted(r["kind"] for r in k8s_resources())
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "ScaledObject",
        "Secret",
        "Service",
    ]


@pytest.mark.parametrize(
    "resource",
    [r for r in k8s_resources() if r["kind"] not in CRD_KINDS],
    ids=lambda r: f"{r['kind']}/{r['metadata']['name']}",
)
def test_manifest_matches_the_kubernetes_schema(resource: dict[str, Any]) -> None:
    # strict: a misspelt or misplaced field is an error, not silently ignored.
    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_schema_validation_catches_a_mistake() -> None:
    broken = k8s_resource("Deployment", "streamworks-coordinator")
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 30  # not a field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("deployment", deployments(), ids=lambda d: d["metadata"]["name"])
def test_commands_and_flags_exist_in_the_cli(deployment: dict[str, Any]) -> None:
    spec = container(deployment)
    assert "command" not in spec, "the image's entrypoint is `streamworks`; set args only"
    check_command_line(spec["args"])


@pytest.mark.parametrize("deployment", deployments(), ids=lambda d: d["metadata"]["name"])
def test_every_environment_variable_is_a_setting(deployment: dict[str, Any]) -> None:
    env = env_of(deployment)
    unknown = set(streamworks_env(env)) - allowed_env_names()
    assert not unknown, f"not streamworks settings: {sorted(unknown)}"
    settings_from_env(env)  # and every value is valid


def test_secret_and_configmap_hold_only_settings() -> None:
    for kind, name in (("Secret", "streamworks-tokens"), ("ConfigMap", "streamworks-config")):
        resource = k8s_resource(kind, name)
        keys = set(resource.get("stringData") or resource.get("data") or {})
        assert keys <= allowed_env_names(), f"{kind} {name}: {sorted(keys - allowed_env_names())}"
    tokens = k8s_resource("Secret", "streamworks-tokens")["stringData"]
    assert {"STREAMWORKS_TOKEN", "STREAMWORKS_ADMIN_TOKEN"} <= set(tokens)


def test_workers_get_no_admin_token() -> None:
    worker = env_of(k8s_resource("Deployment", "streamworks-worker"))
    assert "STREAMWORKS_TOKEN" in worker
    assert "STREAMWORKS_ADMIN_TOKEN" not in worker


async def test_coordinator_probes_exist_on_its_port() -> None:
    deployment = k8s_resource("Deployment", "streamworks-coordinator")
    assert deployment["spec"]["replicas"] == 2
    spec = container(deployment)
    settings = settings_from_env(env_of(deployment))
    args = spec["args"]
    port = int(args[args.index("--port") + 1]) if "--port" in args else settings.coordinator.port
    assert named_port(deployment, "http") == port
    assert settings.coordinator.host == "0.0.0.0"  # reachable from the kubelet
    paths = coordinator_get_paths()
    probes = {kind: spec[kind]["httpGet"] for kind in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/livez"
    for probe in probes.values():
        assert probe["path"] in paths
        assert named_port(deployment, probe["port"]) == port
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in paths
    assert int(annotations["prometheus.io/port"]) == port


def test_coordinator_grace_period_covers_terminating_mode() -> None:
    """SIGTERM comes after preStop; terminating mode then waits up to 2 × mutex_ttl
    for critical sections in flight (streamworks/cli/coordinator.py) before the server
    stops. The grace period holds all of it with room for the server's shutdown."""
    deployment = k8s_resource("Deployment", "streamworks-coordinator")
    pod = deployment["spec"]["template"]["spec"]
    settings = settings_from_env(env_of(deployment))
    pre_stop = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    pre_stop_seconds = float(pre_stop[1])
    # Long enough for proxies to drop the endpoint, short of a readiness-failure cycle.
    assert 1 <= pre_stop_seconds <= 10
    drain = 2 * settings.coordinator.mutex_ttl
    assert pod["terminationGracePeriodSeconds"] >= pre_stop_seconds + drain + 5
    strategy = deployment["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0  # a new replica is ready before an old one stops


def test_worker_grace_period_exceeds_its_shutdown_timeout() -> None:
    deployment = k8s_resource("Deployment", "streamworks-worker")
    settings = settings_from_env(env_of(deployment))
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # In-flight handlers get shutdown_timeout; then acks are flushed and the worker
    # leaves the group (a heartbeat): allow a few heartbeats on top.
    assert grace >= settings.worker.shutdown_timeout + 5 * settings.heartbeat_interval + 5
    assert "replicas" not in deployment["spec"], "the ScaledObject owns the replica count"


def test_selectors_match_pod_labels() -> None:
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in deployments()
    }
    for deployment in deployments():
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pods[deployment["metadata"]["name"]].items()
    service = k8s_resource("Service", "streamworks-coordinator")
    assert service["spec"]["selector"].items() <= pods["streamworks-coordinator"].items()
    [port] = service["spec"]["ports"]
    named_port(k8s_resource("Deployment", "streamworks-coordinator"), port["targetPort"])
    for name in pods:
        pdb = k8s_resource("PodDisruptionBudget", name)
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pods[name].items()
    assert k8s_resource("PodDisruptionBudget", "streamworks-coordinator")["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "streamworks-coordinator"}},
    }


def test_coordinator_urls_point_at_the_service() -> None:
    service = k8s_resource("Service", "streamworks-coordinator")
    [port] = service["spec"]["ports"]
    for deployment in deployments():
        settings = settings_from_env(env_of(deployment))
        assert settings.coordinator_urls == [f"http://{service['metadata']['name']}:{port['port']}"]


def test_scaled_object_targets_the_workers_on_group_lag() -> None:
    """KEDA's ScaledObject is a CRD, not in the Kubernetes schemas: check the fields
    KEDA requires, and that it scales the worker Deployment on the lag of the group
    that Deployment runs."""
    scaled = k8s_resource("ScaledObject", "streamworks-worker")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    allowed = {
        "scaleTargetRef",
        "pollingInterval",
        "cooldownPeriod",
        "initialCooldownPeriod",
        "idleReplicaCount",
        "minReplicaCount",
        "maxReplicaCount",
        "fallback",
        "advanced",
        "triggers",
    }
    assert set(spec) <= allowed, f"unknown ScaledObject fields: {set(spec) - allowed}"
    target = spec["scaleTargetRef"]
    worker = k8s_resource(target.get("kind", "Deployment"), target["name"])
    assert target.get("apiVersion", "apps/v1") == worker["apiVersion"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]

    app = load_target(container(worker)["args"][1])
    [stream] = app.streams.values()
    # More workers than shards sit idle: each shard has one owner at a time.
    assert spec["maxReplicaCount"] <= stream.shards

    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus"
    metadata = trigger["metadata"]
    assert {"serverAddress", "query", "threshold"} <= set(metadata)
    assert all(isinstance(v, str) for v in metadata.values()), "KEDA metadata values are strings"
    assert metadata["serverAddress"].startswith("http")
    assert float(metadata["threshold"]) > 0 and math.isfinite(float(metadata["threshold"]))
    query = metadata["query"]
    assert LAG_METRIC in query
    assert f'group="{app.name}"' in query and f'stream="{stream.name}"' in query
    assert query.count("(") == query.count(")")
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 60


def test_settings_defaults_behind_the_timings() -> None:
    """The manifests spell out the defaults they rely on; if a default changes, this
    test says which timing to revisit."""
    defaults = Settings()
    assert defaults.coordinator.mutex_ttl == 5.0
    assert defaults.worker.shutdown_timeout == 30.0
    assert defaults.coordinator.port == 7400
