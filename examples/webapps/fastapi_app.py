"""A FastAPI app publishing asynchronously: ``async with app.connect()`` in its lifespan.

The connection opens when the server starts and closes when it stops; each request
awaits ``events.publish(...)`` on the server's own event loop::

    uvicorn --factory examples.webapps.fastapi_app:create_app_from_env
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, Header, HTTPException, Response
from pydantic import BaseModel

from examples.webapps.events import Signup, build_app
from streamworks import App, StreamworksError


class Accepted(BaseModel):
    entry_id: str
    duplicate: bool


def create_app(events: App) -> FastAPI:
    """The web app; ``events`` is the streamworks app it publishes with."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with events.connect():
            yield

    web = FastAPI(lifespan=lifespan)

    @web.post("/signups", status_code=202)
    async def signup(
        body: Signup,
        response: Response,
        idempotency_key: Annotated[str | None, Header()] = None,
    ) -> Accepted:
        try:
            published = await events.publish(
                "signups", body, key=body.email, event_id=idempotency_key
            )
        except StreamworksError as e:  # routing unavailable, Redis down: try again later
            raise HTTPException(503, str(e)) from e
        if published.duplicate:  # a retried request: the event was published before
            response.status_code = 200
        return Accepted(entry_id=published.entry_id, duplicate=published.duplicate)

    return web


def create_app_from_env() -> FastAPI:
    return create_app(build_app())  # STREAMWORKS_* settings from the environment
