"""The events the web apps publish, and the worker that handles them.

A sign-up form posts to the web app; the web app publishes a ``signups`` event and
answers at once; a worker sends the welcome mail. The request's ``Idempotency-Key``
header becomes the event id, and the stream remembers event ids for an hour, so a
client retrying a request it got no answer for publishes the event once — the second
request is answered with the first event's entry.

Workers: ``streamworks worker examples.webapps.events:app``. The web apps build their
own ``App`` with :func:`build_app` (same declarations, their own settings).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from streamworks import App, Settings

__all__ = ("Signup", "app", "build_app", "welcomed")


class Signup(BaseModel):
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", max_length=254)
    name: str = Field(min_length=1, max_length=100)


welcomed: list[str] = []  # stands in for the mail server


def build_app(settings: Settings | None = None) -> App:
    """The ``welcome`` app: stream ``signups`` and its handler."""
    app = App("welcome", settings=settings)
    app.stream("signups", shards=4, dedup_window=3600)

    @app.handler("signups", ordering="none")
    async def send_welcome(signup: Signup) -> None:
        welcomed.append(signup.email)

    return app


app = build_app()
