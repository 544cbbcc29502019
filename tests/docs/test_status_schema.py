"""``status --json`` has a stable, documented schema (docs/status-schema.json), and
what a live coordinator returns validates against it (issue 12)."""

from __future__ import annotations

import json
from collections.abc import Callable

import jsonschema

from streamworks import App
from streamworks.testing import TestRuntime
from tests.docs.status_schema import PATH, render


def test_the_committed_schema_is_current() -> None:
    assert PATH.read_text() == render(), (
        "docs/status-schema.json is stale: run python -m tests.docs.status_schema --write "
        "and document the change in docs/cli.md"
    )


async def test_a_live_status_validates_against_the_schema(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=3)

    @app.handler("orders")
    async def handle(value: dict[str, int]) -> None:
        pass

    schema = json.loads(PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    async with streamworks_runtime(app, workers=2) as rt:
        await app.publish("orders", {"n": 1}, key="a")
        await rt.wait_idle()
        await rt.scale("orders", 2, wait=False)
        assert rt.service is not None
        doc = json.loads((await rt.service.status()).model_dump_json(by_alias=True))
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    assert doc["groups"][0]["members"] and doc["streams"][0]["migration"]
    # A document that breaks the schema is refused (the check can fail).
    doc["groups"][0]["groupEpoch"] = "seven"
    try:
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("a string epoch passed the schema")
