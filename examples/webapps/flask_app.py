"""A Flask app publishing synchronously: ``app.publish_sync`` inside ``connect_sync``.

Flask views are plain functions running in the WSGI server's threads. The process
opens the streamworks connection once, with ``events.connect_sync()`` (it runs an
event loop in a background thread); every ``events.publish_sync(...)`` then reuses
that connection from whichever thread serves the request::

    python -m examples.webapps.flask_app          # http://127.0.0.1:8000/signups

The same view works unchanged inside a worker or a ``TestRuntime``: ``publish_sync``
called from another thread hands the publish to that runtime's loop.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, request
from pydantic import ValidationError

from examples.webapps.events import Signup, build_app
from streamworks import App, StreamworksError


def create_app(events: App) -> Flask:
    """The web app; ``events`` is the streamworks app it publishes with."""
    web = Flask(__name__)

    @web.post("/signups")
    def signup() -> tuple[dict[str, Any], int]:
        try:
            body = Signup.model_validate(request.get_json(force=True, silent=True))
        except ValidationError as e:
            return {"error": "INVALID_REQUEST", "message": str(e.errors()[0]["msg"])}, 422
        try:
            published = events.publish_sync(
                "signups",
                body,
                key=body.email,
                event_id=request.headers.get("Idempotency-Key"),
            )
        except StreamworksError as e:  # routing unavailable, Redis down: try again later
            return {"error": "UNAVAILABLE", "message": str(e)}, 503
        status = 200 if published.duplicate else 202
        return {"entry_id": published.entry_id, "duplicate": published.duplicate}, status

    return web


def main() -> None:
    events = build_app()  # STREAMWORKS_* settings from the environment
    with events.connect_sync():  # one connection for the whole process
        create_app(events).run(host="127.0.0.1", port=8000, threaded=True)


if __name__ == "__main__":
    main()
