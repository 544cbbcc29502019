"""``streamworks admin`` — operator actions, e.g. recovery after metadata loss (E21)."""

from __future__ import annotations

from typing import Any

import click

from streamworks.cli.client import coordinator_client
from streamworks.cli.common import coordinator_options, make_settings, run_async
from streamworks.cli.output import confirm
from streamworks.protocol.control import ReinitializeRequest, UnsubscribeRequest
from streamworks.settings import Settings


@click.group()
def admin() -> None:
    """Operator actions (admin token)."""


@admin.group()
def reinit() -> None:
    """Re-create lost metadata of a stream or group (fail-closed recovery, E21)."""


@reinit.command("stream")
@click.argument("name")
@click.option("--shards", type=click.IntRange(0, 4096), required=True, help="shard count to create")
@click.option("--yes", is_flag=True, help="do not ask")
@coordinator_options
def reinit_stream(name: str, shards: int, yes: bool, **flags: Any) -> None:
    """Re-initialise stream NAME: new shards are created; shard keys still in Redis are
    adopted as DRAINING so their entries are consumed before they are retired."""
    confirm(f"re-initialise the metadata of stream {name!r}?", yes=yes, refused="to re-initialise")
    _reinit(ReinitializeRequest(kind="stream", name=name, shards=shards, confirm=True), flags)


@reinit.command("group")
@click.argument("name")
@click.option("--yes", is_flag=True, help="do not ask")
@coordinator_options
def reinit_group(name: str, yes: bool, **flags: Any) -> None:
    """Re-initialise group NAME: empty metadata, epochs above every owner fence;
    its members rejoin on their next heartbeat."""
    confirm(f"re-initialise the metadata of group {name!r}?", yes=yes, refused="to re-initialise")
    _reinit(ReinitializeRequest(kind="group", name=name, confirm=True), flags)


def _reinit(request: ReinitializeRequest, flags: dict[str, Any]) -> None:
    async def run(settings: Settings) -> None:
        async with coordinator_client(settings) as client:
            await client.reinitialize(request)
        click.echo(f"re-initialised {request.kind} {request.name}")

    run_async(run)(make_settings(**flags))


@admin.command("unsubscribe")
@click.argument("group")
@click.argument("stream")
@click.option("--yes", is_flag=True, help="do not ask")
@coordinator_options
def unsubscribe(group: str, stream: str, yes: bool, **flags: Any) -> None:
    """GROUP stops consuming STREAM for good: its consumer groups (positions and pending
    entries) are removed from the stream's shards. Use it for a group that is gone,
    which would otherwise hold back every scale-in of the stream."""
    confirm(
        f"remove group {group!r} from stream {stream!r}, with its unread and pending entries?",
        yes=yes,
        refused="to unsubscribe",
    )

    async def run(settings: Settings) -> None:
        async with coordinator_client(settings) as client:
            await client.unsubscribe(UnsubscribeRequest(group=group, stream=stream, confirm=True))
        click.echo(f"group {group} unsubscribed from {stream}")

    run_async(run)(make_settings(**flags))


@admin.command("acl")
@click.argument("role", type=click.Choice(["worker", "producer", "coordinator"]))
@click.option("--user", default=None, help="ACL user name (default: streamworks-ROLE)")
@click.option("--password", default="<password>", show_default=True)
@click.option("--key-prefix", default=None, help="key namespace [env STREAMWORKS_KEY_PREFIX]")
def acl(role: str, user: str | None, password: str, key_prefix: str | None) -> None:
    """Print the least-privilege `ACL SETUSER` command for a role (see docs/security.md)."""
    from streamworks.redis.acl import setuser_command

    prefix = key_prefix or make_settings().key_prefix
    words = setuser_command(role, user or f"streamworks-{role}", password, prefix)  # type: ignore[arg-type]
    click.echo(" ".join(_quote(w) for w in words))


def _quote(word: str) -> str:
    return f"'{word}'" if any(c in word for c in " ()*{}<>|~") else word
