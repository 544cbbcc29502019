"""The client and the server agree on every endpoint: each definition in
``streamworks.protocol.api`` is a route of ``create_api`` with the same method, path,
models and token, and no ``/v1`` route exists without a definition (a route added by
hand to the server, and unknown to the client, fails here)."""

from __future__ import annotations

import re
from typing import Any, get_args, get_origin

import httpx
import pytest
from fastapi.routing import APIRoute

from streamworks.coordinator.http import create_api
from streamworks.protocol.api import ENDPOINTS, Endpoint
from streamworks.settings import Settings
from tests.coordinator.harness import open_service
from tests.coordinator.test_http_api import ADMIN, MEMBER, secured
from tests.coordinator.test_http_api import ENDPOINTS as AUTH_CASES


def _schema(model: object) -> dict[str, Any]:
    """The OpenAPI schema FastAPI writes for a model or a list of models."""
    if get_origin(model) is list:
        (item,) = get_args(model)
        return {"type": "array", "items": _schema(item)}
    assert isinstance(model, type)
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _without_titles(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _without_titles(v) if isinstance(v, dict) else v
        for k, v in schema.items()
        if k != "title"
    }


def _concrete(endpoint: Endpoint[Any, object]) -> str:
    return endpoint.url(**dict.fromkeys(endpoint.parameters, "x"))


async def test_every_endpoint_is_a_route_with_its_method_path_and_models(
    settings: Settings,
) -> None:
    async with open_service(settings) as service:
        api = create_api(service)
    routes = {
        (method, route.path): route
        for route in api.routes
        if isinstance(route, APIRoute) and route.path.startswith("/v1")
        for method in route.methods or ()
    }
    defined = {(e.method, e.path): e for e in ENDPOINTS}
    assert len(defined) == len(ENDPOINTS), "two definitions share a method and path"
    assert set(routes) == set(defined), "a route without a definition, or the reverse"
    assert len({e.name for e in ENDPOINTS}) == len(ENDPOINTS)

    paths = api.openapi()["paths"]
    for (method, path), endpoint in defined.items():
        assert routes[(method, path)].name == endpoint.name
        operation = paths[path][method.lower()]
        parameters = [p["name"] for p in operation.get("parameters", []) if p["in"] == "path"]
        assert parameters == list(endpoint.parameters), endpoint.name
        assert endpoint.parameters == tuple(re.findall(r"\{(\w+)\}", path))
        body = operation.get("requestBody")
        if endpoint.request is None:
            assert body is None, endpoint.name
        else:
            assert body["required"] is True
            assert body["content"]["application/json"]["schema"] == _schema(endpoint.request)
        answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
        assert _without_titles(answer) == _schema(endpoint.response), endpoint.name


async def test_the_http_api_auth_cases_cover_every_endpoint_with_its_token() -> None:
    # test_http_api checks each of its cases over real HTTP (refused with the wrong
    # token, served with the right one); tie those cases to the definitions.
    cases = {
        (method, re.sub(r"/(g|orders)(?=/|$)", "/x", path)): admin
        for method, path, _, admin in AUTH_CASES
    }
    assert cases == {(e.method, _concrete(e)): e.admin for e in ENDPOINTS}


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.name)
async def test_the_server_asks_for_the_token_the_definition_names(
    settings: Settings, endpoint: Endpoint[Any, object]
) -> None:
    async with open_service(secured(settings)) as service:
        transport = httpx.ASGITransport(app=create_api(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:

            async def status(headers: dict[str, str]) -> int:
                content = b"{}" if endpoint.request is not None else None
                response = await http.request(
                    endpoint.method,
                    _concrete(endpoint),
                    content=content,
                    headers={"content-type": "application/json", **headers},
                )
                return response.status_code

            right, wrong = (ADMIN, MEMBER) if endpoint.admin else (MEMBER, ADMIN)
            assert await status(right) != 401
            assert await status(wrong) == 401
