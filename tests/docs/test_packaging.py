"""The wheel ships what the code loads at run time besides modules: the Lua scripts
and the dashboard's templates and static files (built with hatchling, the project's
build backend, from this checkout)."""

from __future__ import annotations

import zipfile
from pathlib import Path

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
