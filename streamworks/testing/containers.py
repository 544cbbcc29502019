"""A Redis from Docker through ``testcontainers``, when a Docker engine is reachable.

This is an alternative source of a test server, never the only one: where no
Docker engine runs (as on many CI machines), :func:`docker_available` is False and
callers skip it cleanly.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

__all__ = ("docker_available", "redis_container")


def docker_available() -> bool:
    """Whether a Docker engine answers (``DOCKER_HOST`` or the default socket)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1)
                s.connect(host.removeprefix("unix://"))
                s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
                return b"OK" in s.recv(256)
        if host.startswith("tcp://"):
            address, _, port = host.removeprefix("tcp://").partition(":")
            with socket.create_connection((address, int(port or 2375)), timeout=1):
                return True
    except OSError:
        return False
    return False


@contextlib.contextmanager
def redis_container(image: str = "redis:7.2-alpine") -> Iterator[str]:
    """Run a Redis container and yield its URL (requires Docker and testcontainers)."""
    from testcontainers.redis import RedisContainer

    with RedisContainer(image) as container:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(6379)
        yield f"redis://{host}:{port}/0"
