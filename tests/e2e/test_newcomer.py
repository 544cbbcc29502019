"""The acceptance test of issue 22: a fresh project outside this repository, following
``docs/quickstart.md`` literally — its app saved as ``billing.py``, its test as
``test_billing.py`` (which passes with a plain ``pytest``, no configuration), and its
"Running for real" commands run as they are, each its own process: a coordinator,
two workers on one host (the second finds the metrics port taken and takes another),
a publish, a status.

The only thing the test chooses is where: its own Redis server and a free port for
the coordinator, given the way the page says (``STREAMWORKS_REDIS_URL``,
``--port``/``STREAMWORKS_COORDINATOR_URLS`` when 7400 is taken), so it never
depends on a default port being free."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import orjson
import pytest

from streamworks.protocol.control import CLIENT_METRICS, StatusResponse
from streamworks.testing.embedded import EmbeddedRedis
from tests.e2e.harness import Proc, free_port, spawn, wait_until

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "quickstart.md"


def block(marker: str | None, language: str, after: str | None = None) -> str:
    """A code block of the page: the one following ``<!-- marker -->``, or the first
    ``language`` block after the heading ``after``."""
    text = PAGE.read_text()
    if marker is not None:
        found = re.search(rf"<!-- {marker} -->\n```{language}\n(.*?)```", text, re.S)
    else:
        assert after is not None
        start = text.index(after)
        found = re.search(rf"```{language}\n(.*?)```", text[start:], re.S)
    assert found is not None, f"docs/quickstart.md lost its {marker or after} block"
    return found[1]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project of a newcomer's: the page's app and test, nothing else."""
    root = tmp_path / "newcomer"
    root.mkdir()
    assert REPO not in root.parents
    (root / "billing.py").write_text(block(None, "python", after="## A first app"))
    (root / "test_billing.py").write_text(block("quickstart-test", "python"))
    return root


@pytest.fixture
async def server() -> AsyncIterator[EmbeddedRedis]:
    with EmbeddedRedis() as redis:
        yield redis


def outside_env(**extra: str) -> dict[str, str]:
    """The environment of a shell in the project: nothing of this repository."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("STREAMWORKS_") and k not in ("PYTHONPATH", "PYTEST_ADDOPTS")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **extra}


def test_the_projects_own_test_passes(project: Path) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).with_name("pytest")), "-p", "no:cacheprovider", "--rootdir",
         str(project), "-q"],
        cwd=project, env=outside_env(), capture_output=True, text=True, timeout=240,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "1 passed" in result.stdout, result.stdout


async def test_two_workers_on_one_host_as_the_page_says(
    project: Path, server: EmbeddedRedis, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = outside_env(
        STREAMWORKS_REDIS_URL=server.url,
        STREAMWORKS_COORDINATOR__PORT=str(port),
        STREAMWORKS_COORDINATOR_URLS=url,
    )
    commands = [
        shlex.split(line.split("#", 1)[0])
        for line in block("quickstart-run", "sh").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [c[:2] for c in commands] == [
        ["streamworks", "coordinator"],
        ["streamworks", "worker"],
        ["streamworks", "worker"],
        ["streamworks", "publish"],
        ["streamworks", "status"],
    ], commands
    coordinator, first, second, publish, status = commands
    procs: list[Proc] = []
    try:
        for name, command in (("coordinator", coordinator), ("first", first)):
            procs.append(
                spawn(name, ["-m", "streamworks", *command[1:]], env, tmp_path, cwd=project)
            )

        async def members(n: int) -> StatusResponse | None:
            for proc in procs:
                if not proc.alive():
                    raise AssertionError(f"{proc.name} exited:\n{proc.output()}")
            done = await run([*status, "--json"], project, env)
            if done.returncode != 0:
                return None
            answer = StatusResponse.model_validate_json(done.stdout)
            [group] = [g for g in answer.groups if g.group == "billing"] or [None]
            if group is None:
                return None
            live = [m for m in group.members if m.state == "STABLE" and m.assigned]
            return answer if len(live) == n and group.state == "STABLE" else None

        await wait_until(lambda: members(1), 60, "the first worker to read every shard", 0.5)
        procs.append(
            spawn("second", ["-m", "streamworks", *second[1:]], env, tmp_path, cwd=project)
        )
        answer = await wait_until(lambda: members(2), 60, "two workers sharing the shards", 0.5)

        # Two members on one host, each with metrics of its own.
        [group] = [g for g in answer.groups if g.group == "billing"]
        addresses = {m.client.get(CLIENT_METRICS) for m in group.members if m.state == "STABLE"}
        assert len(addresses) == 2 and None not in addresses, group.members
        assert sorted(s for m in group.members for s in m.assigned) == sorted(
            s.shard for s in answer.streams[0].shards
        )

        published = await run(publish, project, env)
        assert published.returncode == 0, published.stderr
        assert re.match(r"published to orders/\d+@0 as \d+-\d+", published.stdout), published.stdout

        async def handled() -> bool:
            done = await run([*status, "--json"], project, env)
            doc = orjson.loads(done.stdout)
            shards = doc["streams"][0]["shards"]
            positions = [g for s in shards for g in s["groups"]]
            return sum(s["length"] or 0 for s in shards) == 1 and all(
                g["lag"] == 0 and g["pending"] == 0 for g in positions
            )

        await wait_until(handled, 30, "the order to be handled", 0.5)
        shown = await run(status, project, env)
        assert shown.returncode == 0 and "group billing: STABLE" in shown.stdout, shown.stdout
        for proc in procs:
            assert proc.alive(), proc.output()
            assert "Traceback" not in proc.output(), proc.output()
    finally:
        for proc in procs:
            if proc.alive():
                proc.popen.kill()
            proc.popen.wait(10)


async def run(command: list[str], cwd: Path, env: dict[str, str]) -> Done:
    """One command of the page, as a shell in the project runs it."""
    assert command[0] == "streamworks"
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [sys.executable, "-m", "streamworks", *command[1:]], cwd=cwd, env=env, check=False
        )
    return Done(done.returncode, done.stdout.decode(), done.stderr.decode())


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str
