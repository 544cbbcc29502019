"""What an admin can do from the dashboard: replay or delete dead letters, scale a stream.

Every action takes three steps, and only the last changes anything:

1. a page (``GET``): the dead letters of a group and stream, selected like ``streamworks
   dlq`` selects them (ids and/or reason, error text, age, limit), or a stream's scale
   form;
2. a preview (``POST .../preview``): the dry run — which dead letters, to which shard
   each replay would go, or the stream's shard count before and after — with a
   confirm button; scaling to 0 shards also needs its box ticked;
3. the action (``POST``), on exactly what the preview listed (the dead letters' ids),
   logged with who (the credential's role, a short id of the session, the address)
   and what.

Each ``POST`` needs the admin credential (never the viewer token), a same-origin
``Origin`` (when the browser sends one) and the CSRF token (``auth.py``). The work is
the library's (``streamworks.dlq``, shared with the CLI) and the service's (scaling),
after the namespace check a producer makes: an action on a Redis that lost this
namespace's data is refused with the same one line. Dead letters go back to their
group only; a page acts on one group's dead letters and nothing else.

Reading dead-letter entries is the one place a coordinator process reads messages,
on an admin's request: the control plane, the status and the viewer's pages never do.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from redis.exceptions import RedisError

from streamworks.coordinator.dashboard.auth import COOKIE, DashboardAuth, same_origin
from streamworks.dlq import REASONS, DeadLetters, Selection, parse_age
from streamworks.exceptions import (
    ConfigurationError,
    CoordinatorError,
    NamespaceMismatchError,
    StreamworksError,
    UnknownNameError,
)
from streamworks.protocol.shards import validate_name
from streamworks.redis.namespace import NamespaceCheck

if TYPE_CHECKING:
    from collections.abc import Callable

    from streamworks.coordinator.service import CoordinatorService

__all__ = ("actions_router",)

log = logging.getLogger("streamworks.coordinator.dashboard")

#: A form's body: a selection and up to MAX_IDS ids.
MAX_FORM = 64 * 1024
MAX_IDS = 1000
#: Entries listed on the dead-letter page (and in a preview) at most.
PAGE_LIMIT = 200
WHERE = "this coordinator (dashboard)"


def actions_router(
    service: CoordinatorService, auth: DashboardAuth, html: Callable[..., HTMLResponse]
) -> APIRouter:
    """The action routes under ``/ui`` of one replica; ``html(template, status,
    request, **context)`` renders a page."""
    router = APIRouter(include_in_schema=False)
    keyspace = service.keyspace
    namespace = NamespaceCheck(service.redis, keyspace, service.settings.redis_url)
    library = DeadLetters(
        service.redis, keyspace, routing=service, namespace=namespace, where=WHERE,
        clock=service.clock,
    )  # fmt: skip

    def refused(request: Request, status: int, message: str) -> HTMLResponse:
        return html("done.html", status, request, title="Refused", error=message, back="/ui/")

    def not_admin(request: Request) -> HTMLResponse | None:
        role = auth.role(request)
        if role is None:
            return refused(request, 401, "log in first (/ui/login)")
        if role != "admin":
            return refused(request, 403, "this takes the admin token, not the viewer token")
        return None

    async def checked_form(request: Request) -> dict[str, list[str]] | HTMLResponse:
        """The POSTed form, once the request may act; or the refusal page."""
        if (page := not_admin(request)) is not None:
            return page
        if not same_origin(request):
            return refused(request, 403, "cross-site request refused")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                return refused(request, 413, "form too large")
        form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=MAX_IDS + 20)
        if not auth.csrf_ok(request, _one(form, "csrf")):
            return refused(request, 403, "missing or wrong CSRF token: reload the page")
        return form

    async def check_namespace() -> None:
        await namespace.verify(await service.ensure_namespace(), coordinator=WHERE)

    # -- dead letters -------------------------------------------------------------------
    @router.get("/ui/dlq/{group}/{stream}")
    async def dead_letters(request: Request, group: str, stream: str) -> Response:
        if (page := not_admin(request)) is not None:
            return page
        query = {k: request.query_params.getlist(k) for k in request.query_params}
        try:
            selection = _selection(query, default_limit=50)
            entries = await library.select(group, stream, selection)
            total = await library.total(group, stream)
        except (ConfigurationError, RedisError) as e:
            return refused(request, _status(e), _message(e))
        return html(
            "dlq.html", 200, request, group=group, stream=stream, total=total, entries=entries,
            selection=selection, form=_selection_fields(selection), reasons=REASONS,
        )  # fmt: skip

    @router.post("/ui/dlq/{group}/{stream}/preview")
    async def dead_letters_preview(request: Request, group: str, stream: str) -> Response:
        form = await checked_form(request)
        if isinstance(form, HTMLResponse):
            return form
        action = _one(form, "action")
        back = f"/ui/dlq/{group}/{stream}"
        try:
            selection = _selection(form, default_limit=PAGE_LIMIT)
            if action == "replay":
                plan = await library.replay(group, stream, selection, dry_run=True)
                rows = [(r.id, f"to {group} on {r.shard}") for r in plan.replayed]
                rows += [(k.id, f"kept: {k.why}") for k in plan.kept]
                ids = [r.id for r in plan.replayed]
            elif action == "delete":
                ids = await library.delete(group, stream, selection, dry_run=True)
                rows = [(i, "deleted") for i in ids]
            else:
                return refused(request, 400, f"unknown action {action!r}")
        except (StreamworksError, RedisError) as e:
            return refused(request, _status(e), _message(e))
        what = "replay to group " + group + " only" if action == "replay" else "delete"
        return html(
            "confirm.html", 200, request,
            title=f"{action.capitalize()} {_count(len(ids), 'dead letter')} of {group}/{stream}?",
            intro=f"Dry run: {what}. Nothing has changed yet.", rows=rows,
            action=f"/ui/dlq/{group}/{stream}/{action}", fields=[("id", i) for i in ids],
            button=f"{action.capitalize()} {_count(len(ids), 'dead letter')}", back=back,
            enabled=bool(ids), acknowledge=None,
        )  # fmt: skip

    @router.post("/ui/dlq/{group}/{stream}/{action}")
    async def dead_letters_act(request: Request, group: str, stream: str, action: str) -> Response:
        form = await checked_form(request)
        if isinstance(form, HTMLResponse):
            return form
        if action not in ("replay", "delete"):
            return refused(request, 404, f"unknown action {action!r}")
        ids = form.get("id", [])
        back = f"/ui/dlq/{group}/{stream}"
        if not ids or _one(form, "confirm") != "yes":
            return refused(request, 400, "nothing confirmed: preview first")
        try:
            selection = Selection.of(ids=ids)
            if action == "replay":
                result = await library.replay(group, stream, selection)
                done = len(result.replayed)
                detail = ", ".join(f"{r.id}→{r.shard}" for r in result.replayed)
                kept = (
                    f"; kept {len(result.kept)} (no payload, or unreadable)" if result.kept else ""
                )
                message = f"Replayed {_count(done, 'dead letter')} to group {group} only{kept}."
            else:
                await check_namespace()
                deleted = await library.delete(group, stream, selection)
                done, detail = len(deleted), ", ".join(deleted)
                message = f"Deleted {_count(done, 'dead letter')}."
        except (StreamworksError, RedisError) as e:
            log.warning(
                "dashboard: %s of dead letters of %s/%s by %s refused: %s",
                action, group, stream, _who(request, auth), _message(e),
            )  # fmt: skip
            return refused(request, _status(e), _message(e))
        log.info(
            "dashboard: %s %s of %s/%s by %s: %s",
            action, _count(done, "dead letter"), group, stream, _who(request, auth), detail,
        )  # fmt: skip
        return html("done.html", 200, request, title="Done", message=message, back=back, error=None)

    # -- scaling ------------------------------------------------------------------------
    @router.get("/ui/streams/{stream}/scale")
    async def scale_page(request: Request, stream: str) -> Response:
        if (page := not_admin(request)) is not None:
            return page
        try:
            info = await service.stream_info(_name("stream", stream))
        except (StreamworksError, RedisError) as e:
            return refused(request, _status(e), _message(e))
        return html("scale.html", 200, request, stream=info)

    @router.post("/ui/streams/{stream}/scale/preview")
    async def scale_preview(request: Request, stream: str) -> Response:
        form = await checked_form(request)
        if isinstance(form, HTMLResponse):
            return form
        try:
            shards = _shards(_one(form, "shards"))
            info = await service.stream_info(_name("stream", stream))
        except (StreamworksError, RedisError) as e:
            return refused(request, _status(e), _message(e))
        before = info.shard_count
        if shards > before:
            effect = "scale-out: the new shards are routable at once"
        elif shards < before:
            effect = (
                "scale-in: the removed shards stop receiving at once, are read to the end "
                "and retired once every group drained them"
            )
        else:
            effect = "no change"
        zero = (
            "Scaling to 0 shards: every publish to this stream fails until it is scaled out again."
        )
        return html(
            "confirm.html", 200, request,
            title=f"Scale {stream} from {_count(before, 'shard')} to {shards}?",
            intro=f"{effect}. Nothing has changed yet.", rows=[],
            action=f"/ui/streams/{stream}/scale", fields=[("shards", str(shards))],
            button=f"Scale to {_count(shards, 'shard')}", back=f"/ui/streams/{stream}/scale",
            enabled=shards != before, acknowledge=zero if shards == 0 else None,
        )  # fmt: skip

    @router.post("/ui/streams/{stream}/scale")
    async def scale(request: Request, stream: str) -> Response:
        form = await checked_form(request)
        if isinstance(form, HTMLResponse):
            return form
        try:
            shards = _shards(_one(form, "shards"))
            if _one(form, "confirm") != "yes":
                return refused(request, 400, "nothing confirmed: preview first")
            if shards == 0 and _one(form, "acknowledge") != "yes":
                return refused(request, 400, "scaling to 0 shards must be acknowledged")
            await check_namespace()
            info = await service.scale_stream(_name("stream", stream), shards)
        except (StreamworksError, RedisError) as e:
            log.warning(
                "dashboard: scale of %s to %s by %s refused: %s",
                stream, _one(form, "shards"), _who(request, auth), _message(e),
            )  # fmt: skip
            return refused(request, _status(e), _message(e))
        log.info(
            "dashboard: scale %s to %s by %s (routing v%d)",
            stream, _count(info.shard_count, "shard"), _who(request, auth), info.routing_version,
        )  # fmt: skip
        message = f"Stream {stream}: routing now has {_count(info.shard_count, 'shard')}."
        return html(
            "done.html", 200, request, title="Done", message=message, back="/ui/", error=None
        )

    return router


# -- helpers ------------------------------------------------------------------------------
def _one(form: dict[str, list[str]], name: str) -> str:
    values = form.get(name) or [""]
    return values[0].strip()


def _selection(form: dict[str, list[str]], *, default_limit: int) -> Selection:
    """The CLI's selection from a form or a query string (``ConfigurationError``)."""
    ids = [i for raw in form.get("ids", []) for i in raw.replace(",", " ").split()]
    ids += [i.strip() for i in form.get("id", []) if i.strip()]
    if len(ids) > MAX_IDS:
        raise ConfigurationError(f"at most {MAX_IDS} ids at once")
    older, newer = _one(form, "older_than"), _one(form, "newer_than")
    limit = _one(form, "limit")
    if limit and not limit.isdigit():
        raise ConfigurationError(f"the limit {limit!r} is not a number")
    return Selection.of(
        ids=ids,
        reasons=[r for r in form.get("reason", []) if r],
        error=_one(form, "error") or None,
        older_than=parse_age(older) if older else None,
        newer_than=parse_age(newer) if newer else None,
        limit=min(int(limit), PAGE_LIMIT) if limit else (None if ids else default_limit),
    )


def _selection_fields(selection: Selection) -> list[tuple[str, str]]:
    """The selection as form fields, to carry it from the page into a preview."""
    fields = [("ids", " ".join(selection.ids))] if selection.ids else []
    fields += [("reason", r) for r in selection.reasons]
    if selection.error:
        fields.append(("error", selection.error))
    for name, seconds in (
        ("older_than", selection.older_than),
        ("newer_than", selection.newer_than),
    ):
        if seconds is not None:
            fields.append((name, f"{seconds:g}s"))
    if selection.limit is not None:
        fields.append(("limit", str(selection.limit)))
    return fields


def _shards(text: str) -> int:
    if not text.isdigit() or int(text) > 4096:
        raise ConfigurationError(f"{text!r} is not a shard count (0-4096)")
    return int(text)


def _name(kind: str, value: str) -> str:
    return validate_name(kind, value)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _status(error: BaseException) -> int:
    if isinstance(error, UnknownNameError):
        return 404
    if isinstance(error, CoordinatorError):
        return error.status or 409
    if isinstance(error, NamespaceMismatchError | RedisError):
        return 503
    return 400


def _message(error: BaseException) -> str:
    if isinstance(error, CoordinatorError):
        return f"{error.code}: {error.message}"
    if isinstance(error, RedisError):
        return f"Redis: {error}"
    return str(error)


def _who(request: Request, auth: DashboardAuth) -> str:
    """Who acted, for the log: the role, a short id of the credential (never the
    credential) and the client's address."""
    credential = request.cookies.get(COOKIE) or request.headers.get("authorization", "")
    session = hashlib.sha256(credential.encode()).hexdigest()[:8] if credential else "none"
    address = request.client.host if request.client is not None else "?"
    return f"{auth.role(request)} (session {session}, from {address})"
