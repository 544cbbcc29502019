"""Least-privilege Redis users for tests: one user per role, as ``streamworks admin acl``
prints them, so a test runs every component as production should.

:func:`open_role_users` creates a worker, a producer and a coordinator user for one
key prefix (random names and passwords; on a Redis Cluster on every node, replicas
included, as ``docs/cluster.md`` says), hands out a URL per role, and at exit reads
the server's ``ACL LOG`` for those users and deletes them. ``ACL LOG`` is the
strongest check there is: it records every command a user was refused, whether or not
the code that sent it logged, retried or swallowed the refusal.

Users are server-wide and may share a server with other tests (or other people): only
the users created here are read from the log and deleted; the log itself is never reset.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from redis.asyncio import RedisCluster

from streamworks.redis.acl import ROLES, Role, setuser_command
from streamworks.redis.client import seed_urls
from streamworks.redis.redis_py import slot_map_stale

__all__ = (
    "AclRefusals",
    "RoleUsers",
    "acl_log",
    "on_every_node",
    "open_role_users",
    "with_credentials",
)


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` (each of a cluster's comma-separated seed URLs) logging in as ``user``."""
    out = []
    for seed in seed_urls(url):
        parts = urlsplit(seed)
        host = parts.netloc.rsplit("@", 1)[-1]
        netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
        out.append(urlunsplit(parts._replace(netloc=netloc)))
    return ",".join(out)


async def on_every_node(admin: Any, *command: Any) -> list[Any]:
    """Run ``command`` on the server, or on every node of a cluster (ACL state is per
    node); the replies, one per node."""
    if isinstance(admin, RedisCluster):
        if slot_map_stale(admin):  # the node list is loaded on first use
            await admin.initialize()
        replies = await admin.execute_command(*command, target_nodes=admin.get_nodes())
        return list(replies.values()) if isinstance(replies, dict) else [replies]
    return [await admin.execute_command(*command)]


async def acl_log(admin: Any, users: set[str]) -> list[dict[str, str]]:
    """The ``ACL LOG`` entries of ``users`` (on a cluster: of every node): what they were
    refused, as ``{field: text}`` (``reason``, ``context``, ``object``, ``username``,
    ``count``...)."""
    found = []
    for reply in await on_every_node(admin, "ACL", "LOG", "128"):
        for entry in reply or []:
            fields = _entry(entry)
            if fields.get("username") in users:
                found.append(fields)
    return found


def _entry(entry: Any) -> dict[str, str]:
    if isinstance(entry, dict):
        items = list(entry.items())
    else:  # RESP2 without the client's callback: a flat list
        items = list(zip(entry[::2], entry[1::2], strict=True))
    return {_text(k): _text(v) for k, v in items}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(slots=True)
class RoleUsers:
    """The users of one :func:`open_role_users` block.

    Attributes:
        urls: role -> the Redis URL that logs in as the role's user.
        names: role -> user name.
    """

    urls: dict[Role, str] = field(default_factory=dict)
    names: dict[Role, str] = field(default_factory=dict)

    def url(self, role: Role) -> str:
        return self.urls[role]


class AclRefusals(AssertionError):
    """A role's user was refused commands (``ACL LOG``): its ACL misses what its code runs."""


@contextlib.asynccontextmanager
async def open_role_users(
    admin: Any,
    base_url: str,
    prefix: str,
    *,
    roles: tuple[Role, ...] = ROLES,
    check_log: bool = True,
) -> AsyncIterator[RoleUsers]:
    """Create one user per role for keys under ``prefix`` and delete them at exit.

    Args:
        admin: a client that may run ``ACL SETUSER`` (the test's own, default user).
        base_url: the server's URL (or a cluster's seeds); the role URLs are it with
            each user's credentials.
        check_log: at exit, raise :class:`AclRefusals` listing every ``ACL LOG`` entry
            of these users (checked after the block, before the users are deleted).

    Raises:
        AclRefusals: with ``check_log``, a user was refused something.
    """
    users = RoleUsers()
    tag = secrets.token_hex(4)
    try:
        for role in roles:
            name, password = f"sw-test-{role}-{tag}", secrets.token_hex(16)
            users.names[role] = name
            await on_every_node(admin, *setuser_command(role, name, password, prefix))
            users.urls[role] = with_credentials(base_url, name, password)
        yield users
        if check_log:
            refused = await acl_log(admin, set(users.names.values()))
            if refused:
                lines = [
                    f"{e.get('username')}: {e.get('reason')} {e.get('object')!r} "
                    f"(context {e.get('context')}, x{e.get('count', '1')})"
                    for e in refused
                ]
                raise AclRefusals("role users were refused by Redis:\n" + "\n".join(lines))
    finally:
        for name in users.names.values():
            with contextlib.suppress(Exception):  # a node that is down has no user left
                await on_every_node(admin, "ACL", "DELUSER", name)
