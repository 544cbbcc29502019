"""Recovery steps: after Redis lost writes, and after an operator re-initialises.

When an owner fence refuses a grant because it holds a *newer* epoch than the group
ever recorded, the group's metadata went back in time (a failover or restore lost
writes) while the shard's slot kept its fence. The member that got the refused grant
is fenced (it drops everything and rejoins with epoch 0), and the group epoch is
raised above the fence's epoch, so every epoch issued from now on is newer than
anything issued before the loss (E19).
"""

from __future__ import annotations

from streamworks.coordinator.core.changes import GroupEdit, TimerResult
from streamworks.coordinator.core.model import Group, MemberState

__all__ = ("empty_group", "fence_after_regression")


def fence_after_regression(
    group: Group, member_id: str, fence_epoch: int, now_ms: int
) -> TimerResult:
    """Fence ``member_id`` and raise the group epoch above ``fence_epoch``."""
    edit = GroupEdit(group)
    edit.raise_group_epoch_above(fence_epoch)
    if edit.retire(member_id, MemberState.FENCED, now_ms):
        edit.bump()
        edit.settle_if_empty()
    return edit.timer_result()


def empty_group(group_id: str, epoch_floor: int = 0) -> Group:
    """A group with no members whose epochs start above ``epoch_floor`` (the highest
    epoch found in its owner fences when it is re-initialised, E21)."""
    epoch = epoch_floor + 1 if epoch_floor else 0
    return Group(group_id, group_epoch=epoch, target_epoch=epoch, metadata_version=epoch)
