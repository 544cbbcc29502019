"""The slow app with one rule of the protocol broken on purpose (the trace check's test).

Run as ``streamworks worker tests.e2e.apps.broken:app`` with
``E2E_BROKEN_RULE=renew-revoked-lease``: the member breaks the rule "a member told
``FENCED`` or ``UNKNOWN_MEMBER`` drops every shard, and reads again only under fresh
grants" (``runtime/membership.py``, ``member.qnt``). Told so, it acts as if the answer
were ``OK`` and granted again what its last ``OK`` answer granted, under the same
tokens: it keeps its shards and renews its lease from that answer. Without the
variable it is the slow app, unchanged. Only this test module honours the variable
(it patches the runtime class in its own process); the library has no such switch.
``tests/e2e/test_trace_real_runs.py`` shows the trace check catching it.
"""

from __future__ import annotations

import os
from typing import Any

from streamworks.protocol.control import HeartbeatResponse, HeartbeatStatus, ShardGrant
from streamworks.runtime.membership import CoordinatorAssignment
from tests.e2e.apps.slow import app

__all__ = ("app",)

RULE = os.environ.get("E2E_BROKEN_RULE", "")
_LOST = (HeartbeatStatus.FENCED, HeartbeatStatus.UNKNOWN_MEMBER)
_apply = CoordinatorAssignment._apply
_last_grants: dict[int, list[ShardGrant]] = {}  # id(assignment) -> its last OK grants


def _renew_revoked_lease(
    self: CoordinatorAssignment, worker: Any, response: HeartbeatResponse, sent: float
) -> None:
    if response.status is HeartbeatStatus.OK:
        _last_grants[id(self)] = list(response.assigned)
    elif response.status in _LOST and _last_grants.get(id(self)):
        response = response.model_copy(
            update={
                "status": HeartbeatStatus.OK,
                "member_epoch": self.epoch,
                "assigned": _last_grants[id(self)],
                "revoke": [],
            }
        )
    _apply(self, worker, response, sent)


if RULE == "renew-revoked-lease":
    CoordinatorAssignment._apply = _renew_revoked_lease  # type: ignore[method-assign]
elif RULE:
    raise SystemExit(f"E2E_BROKEN_RULE: unknown rule {RULE!r}")
