"""Apps the end-to-end tests run as real worker processes."""

from __future__ import annotations

from typing import Any

_client: Any = None


def record_url() -> str | None:
    """The URL the test apps write their records with: the worker's own Redis URL,
    through the same path (a test's proxy, if any), as the default user. Set by the
    harness (``E2E_RECORD_AS_DEFAULT_USER=1``): under ``--redis-acl`` the worker's ACL
    user may touch only streamworks' keys, as an application keeps its own data under
    its own credentials. None: the worker's own client."""
    import os
    from urllib.parse import urlsplit, urlunsplit

    url = os.environ.get("STREAMWORKS_REDIS_URL")
    if not url or not os.environ.get("E2E_RECORD_AS_DEFAULT_USER"):
        return None
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return None  # the worker logs in as the default user already: its own client
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))


def record_client(worker_redis: Any) -> Any:
    """The asyncio client the test apps write their records with: one of
    :func:`record_url`, made once per process, else ``worker_redis``."""
    global _client
    url = record_url()
    if url is None:
        return worker_redis
    if _client is None:
        from streamworks.redis.client import create_redis
        from streamworks.settings import Settings

        _client = create_redis(Settings(redis_url=url))
    return _client
