"""redis-py is pinned to the releases whose undocumented API streamworks was tested
with (``streamworks/redis/redis_py.py``): the installed release must be one of them,
the pin in ``pyproject.toml`` must admit exactly them, and the private parts used must
still be there (a release that removed them would break cluster routing silently)."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode, NodesManager
from redis.asyncio.connection import AbstractConnection

from streamworks.redis.redis_py import TESTED_REDIS_PY, reload_slot_map, slot_map_stale

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _series(v: Version) -> str:
    return f"{v.major}.{v.minor}"


def _redis_requirement() -> Requirement:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [requirement] = [r for r in map(Requirement, dependencies) if r.name == "redis"]
    return requirement


def test_the_installed_redis_py_is_a_tested_release() -> None:
    installed = Version(version("redis"))
    assert _series(installed) in TESTED_REDIS_PY, (
        f"redis-py {installed} is not among the tested releases {TESTED_REDIS_PY} "
        "(streamworks/redis/redis_py.py): run the suite on it, the cluster suites above "
        "all, then add it there and widen the pin in pyproject.toml"
    )


def test_the_pin_admits_exactly_the_tested_series() -> None:
    specifier = _redis_requirement().specifier
    tested = sorted(Version(s) for s in TESTED_REDIS_PY)
    for series in tested:
        for patch in (0, 9):
            assert specifier.contains(f"{series.major}.{series.minor}.{patch}"), (series, patch)
    lowest, highest = tested[0], tested[-1]
    below = f"{lowest.major}.{lowest.minor - 1}.99" if lowest.minor else f"{lowest.major - 1}.99"
    above = f"{highest.major}.{highest.minor + 1}.0"
    assert not specifier.contains(below), f"the pin admits {below}, older than tested"
    assert not specifier.contains(above), f"the pin admits {above}, newer than tested"
    assert not specifier.contains(f"{highest.major + 1}.0.0")


@pytest.mark.parametrize("installed", ["5.2.1", "8.0.0", "8.2.0", "9.0.0"])
def test_an_untested_release_is_refused(installed: str) -> None:
    """The checks above fail for a release outside the list (here: outside 8.1)."""
    assert TESTED_REDIS_PY == ("8.1",), "update the examples with the list"
    assert _series(Version(installed)) not in TESTED_REDIS_PY
    assert not _redis_requirement().specifier.contains(installed)


def test_the_private_api_used_is_there() -> None:
    cluster = RedisCluster(host="127.0.0.1", port=1)  # connects on first use only
    assert slot_map_stale(cluster)  # the node list is loaded on first use
    cluster._initialize = False
    assert not slot_map_stale(cluster)
    reload_slot_map(cluster)
    assert slot_map_stale(cluster)
    assert isinstance(cluster.nodes_manager, NodesManager)
    for name in ("get_node", "get_node_from_slot", "move_slot"):
        assert callable(getattr(NodesManager, name, None)), name
    for name in ("acquire_connection", "release"):
        assert callable(getattr(ClusterNode, name, None)), name
    for name in ("send_packed_command", "read_response"):
        assert callable(getattr(AbstractConnection, name, None)), name
