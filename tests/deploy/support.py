"""What the deployment tests share: the files under deploy/, and the real CLI, settings
and coordinator routes they are checked against."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import BaseModel

from streamworks import App
from streamworks.cli import cli
from streamworks.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_BASE = DEPLOY / "k8s" / "base"
COMPOSE = DEPLOY / "compose.yaml"

#: The worker's HTTP endpoint (another change adds it): the default port the
#: deployment files use, and the paths they probe and scrape.
WORKER_HTTP_PORT = 9400
WORKER_HTTP_PATHS = ("/livez", "/readyz", "/metrics")
WORKER_HTTP_FLAGS = ("--http-port", "--http-host", "--no-http")
#: Settings of the worker's HTTP endpoint the deployment files use. Until the endpoint
#: exists they are accepted as they are (and ignored by Settings); once it does, they
#: must be real settings like every other.
WORKER_HTTP_ENV = frozenset({"STREAMWORKS_WORKER__HTTP_HOST"})
#: The coordinator's lag gauge the KEDA ScaledObject queries.
LAG_METRIC = "streamworks_coordinator_shard_lag"


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def kustomization() -> dict[str, Any]:
    [doc] = load_yaml_documents(K8S_BASE / "kustomization.yaml")
    return doc


def k8s_resources() -> list[dict[str, Any]]:
    """Every resource the kustomize base lists, in order."""
    docs: list[dict[str, Any]] = []
    for name in kustomization()["resources"]:
        docs.extend(load_yaml_documents(K8S_BASE / name))
    return docs


def k8s_resource(kind: str, name: str) -> dict[str, Any]:
    found = [r for r in k8s_resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def compose() -> dict[str, Any]:
    [doc] = load_yaml_documents(COMPOSE)
    return doc


# -- the CLI -------------------------------------------------------------------------------
def resolve_command(args: Sequence[str]) -> tuple[click.Command, list[str], list[str]]:
    """Walk ``streamworks ARGS`` down the real click tree: (the leaf command, its
    path of command names, the arguments left for it). Fails on an unknown command."""
    command: click.Command = cli
    path = ["streamworks"]
    rest = list(args)
    while isinstance(command, click.Group):
        assert rest, f"`{' '.join(path)}` needs a subcommand"
        name = rest.pop(0)
        sub = command.commands.get(name)
        assert sub is not None, f"`{' '.join(path)}` has no subcommand {name!r}"
        command, path = sub, [*path, name]
    return command, path, rest


def check_command_line(args: Sequence[str]) -> click.Command:
    """Parse ``streamworks ARGS`` with the real CLI, as running it would, without
    running it: an unknown command or flag, a missing argument or a bad value fails."""
    command, path, rest = resolve_command(args)
    try:
        command.make_context(" ".join(path), list(rest))
    except click.ClickException as e:
        raise AssertionError(f"`{' '.join(path)} {' '.join(rest)}`: {e.format_message()}") from e
    return command


def option_names(command: click.Command) -> set[str]:
    return {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts}


def option_default(command: click.Command, flag: str) -> Any:
    [param] = [p for p in command.params if flag in getattr(p, "opts", ())]
    return param.default


def load_target(target: str) -> App:
    """The App a ``MODULE:APP`` worker argument names."""
    module, _, attribute = target.partition(":")
    app = getattr(importlib.import_module(module), attribute or "app")
    assert isinstance(app, App), f"{target} is not a streamworks.App"
    return app


def worker_has_http() -> bool:
    command, _, _ = resolve_command(["worker"])
    return "--http-port" in option_names(command)


# -- settings -------------------------------------------------------------------------------
def setting_env_names() -> set[str]:
    """The environment variables :class:`Settings` reads: ``STREAMWORKS_<FIELD>`` and,
    for nested groups, ``STREAMWORKS_<GROUP>__<FIELD>``."""
    prefix = Settings.model_config["env_prefix"]
    delimiter = Settings.model_config["env_nested_delimiter"]
    names: set[str] = set()
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            for sub in annotation.model_fields:
                names.add(f"{prefix}{name}{delimiter}{sub}".upper())
        else:
            names.add(f"{prefix}{name}".upper())
    return names


def coordinator_has_viewer_token() -> bool:
    command, _, _ = resolve_command(["coordinator"])
    return "--viewer-token" in option_names(command)


#: Settings the deployment files use that other changes are adding, each with the
#: test of whether its change has landed. Until it has, the name is accepted as it is
#: (Settings ignores it); from then on it must be a real setting like every other
#: (test_pending_settings_are_real_once_they_land).
PENDING_ENV: dict[str, Callable[[], bool]] = {
    **dict.fromkeys(WORKER_HTTP_ENV, worker_has_http),
    "STREAMWORKS_VIEWER_TOKEN": coordinator_has_viewer_token,
}


def allowed_env_names() -> set[str]:
    """The STREAMWORKS_* names deployment files and pages may use: the settings, and
    the pending ones whose change has not landed yet."""
    pending = {name for name, landed in PENDING_ENV.items() if not landed()}
    return setting_env_names() | pending


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """Settings as a process with exactly these STREAMWORKS_* variables builds them."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("STREAMWORKS_")}
    try:
        for key in saved:
            del os.environ[key]
        os.environ.update({k: v for k, v in env.items() if k.startswith("STREAMWORKS_")})
        return Settings()
    finally:
        for key in [k for k in os.environ if k.startswith("STREAMWORKS_")]:
            del os.environ[key]
        os.environ.update(saved)


def streamworks_env(env: Mapping[str, str]) -> Iterator[str]:
    return (k for k in env if k.startswith("STREAMWORKS_"))


# -- the coordinator's routes ------------------------------------------------------------------
def coordinator_get_paths() -> set[str]:
    """The paths the real coordinator API answers GET on (needs a running event loop:
    the service creates anyio primitives)."""
    from streamworks.coordinator.http import create_api
    from streamworks.coordinator.service import CoordinatorService
    from streamworks.redis.client import create_redis

    settings = Settings()
    api = create_api(CoordinatorService(create_redis(settings), settings))
    return {
        route.path
        for route in api.routes
        if "GET" in getattr(route, "methods", ()) and hasattr(route, "path")
    }
