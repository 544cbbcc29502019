"""Opening the coordinator client for a command, with a clear error when unreachable."""

from __future__ import annotations

from streamworks.protocol.client import CoordinatorClient
from streamworks.settings import Settings

__all__ = ("coordinator_client",)


def coordinator_client(settings: Settings) -> CoordinatorClient:
    return CoordinatorClient(
        settings.coordinator_urls,
        token=settings.token.get_secret_value() if settings.token else None,
        admin_token=settings.admin_token.get_secret_value() if settings.admin_token else None,
    )
