"""The JSON Schema of ``streamworks status --json``, kept in docs/status-schema.json.

``python -m tests.docs.status_schema --write`` regenerates it from the protocol model;
``tests/docs/test_status_schema.py`` fails when the committed file is stale, so a
change of the schema is always a deliberate, reviewed change of that file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from streamworks.protocol.control import StatusResponse

PATH = Path(__file__).resolve().parents[2] / "docs" / "status-schema.json"


def _open(node: Any) -> Any:
    """The published schema lets objects grow: new fields may be added in a minor
    release (readers must ignore what they do not know); none is removed or changed."""
    if isinstance(node, dict):
        return {k: _open(v) for k, v in node.items() if (k, v) != ("additionalProperties", False)}
    if isinstance(node, list):
        return [_open(v) for v in node]
    return node


def schema() -> dict[str, Any]:
    doc = _open(StatusResponse.model_json_schema(by_alias=True, mode="serialization"))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://streamworks.dev/schemas/status.json",
        **doc,
    }


def render() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    if "--write" in sys.argv:
        PATH.write_text(render())
    else:
        sys.stdout.write(render())
