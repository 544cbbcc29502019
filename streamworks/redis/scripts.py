"""Registry of the Lua scripts in ``streamworks/redis/lua``.

Scripts are read with :mod:`importlib.resources` and registered once per client;
redis-py's script objects call ``EVALSHA`` and reload on ``NOSCRIPT``. Every key a
script touches is passed in ``KEYS`` (built by :class:`~streamworks.redis.keyspace.Keyspace`),
never assembled inside Lua, so each script stays within one Cluster slot.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

from streamworks.redis.wire import Arg, call, run_batch

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

__all__ = ("SCRIPT_NAMES", "Scripts", "load_script")

#: Every script shipped with streamworks (file name without ``.lua``).
SCRIPT_NAMES = (
    "claim",
    "dead_letter",
    "fence",
    "group_commit",
    "group_create",
    "group_destroy",
    "lease_renew",
    "mutex_release",
    "prune_consumers",
    "publish_dedup",
    "read",
    "redeliver",
    "retire",
    "retry_record",
    "shard_create",
    "shard_groups",
    "stream_commit",
    "trim",
)


@cache
def load_script(name: str) -> str:
    """Return the source of ``lua/<name>.lua`` from the installed package."""
    return (resources.files("streamworks.redis") / "lua" / f"{name}.lua").read_text("utf-8")


class Scripts:
    """The scripts, registered on one redis-py asyncio client."""

    claim: AsyncScript
    dead_letter: AsyncScript
    fence: AsyncScript
    group_commit: AsyncScript
    group_create: AsyncScript
    group_destroy: AsyncScript
    lease_renew: AsyncScript
    mutex_release: AsyncScript
    prune_consumers: AsyncScript
    publish_dedup: AsyncScript
    read: AsyncScript
    redeliver: AsyncScript
    retire: AsyncScript
    retry_record: AsyncScript
    shard_create: AsyncScript
    shard_groups: AsyncScript
    stream_commit: AsyncScript
    trim: AsyncScript

    def __init__(self, client: Any) -> None:
        self._client = client
        for name in SCRIPT_NAMES:
            setattr(self, name, client.register_script(load_script(name)))

    async def call(self, name: str, keys: list[Arg], args: list[Arg]) -> Any:
        """Run script ``name`` with less per-call work than redis-py's script object
        (hand-packed ``EVALSHA``, see :mod:`streamworks.redis.wire`): for the hot
        paths, such as the fenced read. Loads the script on ``NOSCRIPT`` (a restarted
        or flushed server) and runs it again."""
        script = getattr(self, name)
        command: list[Arg] = ["EVALSHA", script.sha, len(keys), *keys, *args]
        try:
            return await call(self._client, command)
        except NoScriptError:
            await self._client.script_load(script.script)
            return await call(self._client, command)

    async def call_after(
        self, first: list[Arg], name: str, keys: list[Arg], args: list[Arg]
    ) -> Any:
        """Send ``first`` (a blocking command, such as ``XREAD BLOCK``) and script
        ``name`` in one write on one connection and return the script's reply: Redis
        runs the script the moment ``first`` returns, with no round trip between."""
        script = getattr(self, name)
        waited, reply = await run_batch(
            self._client, [first, ["EVALSHA", script.sha, len(keys), *keys, *args]]
        )
        if isinstance(waited, Exception):
            raise waited
        if isinstance(reply, NoScriptError):
            return await self.call(name, keys, args)
        if isinstance(reply, Exception):
            raise reply
        return reply
