"""Fence tokens: the number a grant is fenced with, that never repeats.

A grant of a shard to a member is written as the shard's owner fence
``"<token>:<member id>"`` and handed to the member's handlers as
``ctx.fencing_token``. Applications fence their own side effects with it, so it must
never go down for a shard: not when the shard changes owner, not across a scale-out or
scale-in, a coordinator failover, or a Redis failover that lost writes.

A group epoch cannot be that number: it lives in the group's metadata, and a Redis
failover to a replica that had not received the last writes puts an older epoch back,
from which the next grants would repeat epochs already handed out. A token is
therefore

    ``max(last_token + 1, now_ms * TOKENS_PER_MS)``

where ``last_token`` is the highest token the group recorded and ``now_ms`` the Redis
server time of the grant. The first term makes tokens strictly increase with every
grant the metadata knows of; the second is the part that survives a loss of writes:
a token issued after the loss is above Redis time at that moment, and every token
issued before it was at most Redis time then (plus the few grants of the same
millisecond, ``TOKENS_PER_MS`` apart). That holds while the clock of the node that
took over does not read earlier than the lost writes did — a failover takes seconds,
NTP keeps nodes within milliseconds, and a Redis clock that steps back is detected
and holds grants until it has caught up (``clock_steps.py``).

The numbers stay below 2**53 (exact in Lua's doubles and in JSON) until the year 2248.
"""

from __future__ import annotations

__all__ = ("TOKENS_PER_MS", "next_token", "parse_token")

#: Tokens available within one millisecond of Redis time before the token runs ahead
#: of the clock (each step that grants takes one; a batch takes at most a few hundred).
TOKENS_PER_MS = 1024


def next_token(last_token: int, now_ms: int) -> int:
    """The token of a grant made at Redis time ``now_ms`` after ``last_token``."""
    return max(last_token + 1, now_ms * TOKENS_PER_MS)


def parse_token(fence: str) -> int | None:
    """The token of a fence value ``"<token>:<member id>"``; None when it has none."""
    head = fence.split(":", 1)[0]
    return int(head) if head.isdigit() else None
