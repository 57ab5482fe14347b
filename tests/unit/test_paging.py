"""Keyset cursors (``operations.paging``), the saga pages of the memory read model by cursor, and any saga id as one
segment of a console path (``console.saga_paths``), routed through a small app as the console routes it."""

from __future__ import annotations

import base64
from urllib.parse import unquote

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from saga_orchestrator.console.saga_paths import SagaIdPaths, routing_path, saga_segment
from saga_orchestrator.operations.paging import BadCursor, decode_cursor, encode_cursor, page_of

ODD_IDS = ["a/b", "a?b", "a#b", "rés/ümé 1", "a%2Fb", "50%", "x/history", "a b+c", "a/", "/", "..", ".", "a..b"]


@pytest.mark.parametrize("key", [(0, ""), (1_700_000_000_123, "rés/ümé 1"), (-5, "a\"b"), (42, "\ud800 lone")])
def test_a_cursor_gives_back_its_key(key: tuple[int, str]) -> None:
    cursor = encode_cursor(*key)
    assert decode_cursor(cursor) == key
    assert set(cursor) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")  # URL-safe


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


@pytest.mark.parametrize("cursor", ["", "!!!", "abc", _b64("[1]"), _b64('["1","a"]'), _b64("[1,2]"),
                                    _b64('[true,"a"]'), _b64('[1.5,"a"]'), _b64('{"a":1}'), _b64('[1,"a\\u0000"]'),
                                    _b64('[1e400,"a"]'), _b64('[99999999999999999999,"a"]'),
                                    base64.urlsafe_b64encode(b"\xff\xfe").decode(), "A" * 5000])
def test_a_cursor_no_page_gave_is_refused_plainly(cursor: str) -> None:
    with pytest.raises(BadCursor, match="malformed cursor"):
        decode_cursor(cursor)


def test_a_page_has_a_next_cursor_only_when_more_rows_follow() -> None:
    def key(row: int) -> tuple[int, str]:
        return row, str(row)

    assert page_of([1, 2, 3], 2, key).rows == [1, 2] and decode_cursor(page_of([1, 2, 3], 2, key).next_cursor or "") \
        == (2, "2")
    assert page_of([1, 2], 2, key).next_cursor is None and page_of([], 2, key).next_cursor is None


@pytest.mark.parametrize("saga_id", ODD_IDS)
def test_a_saga_id_is_one_segment_and_the_routing_path_keeps_it_one(saga_id: str) -> None:
    segment = saga_segment(saga_id)
    assert "/" not in segment and "?" not in segment and "#" not in segment
    assert segment not in (".", "..")  # a URL would read those as steps
    routed = routing_path(f"/api/v1/sagas/{segment}/history")
    prefix, kept, suffix = routed.split("/")[1:4], routed.split("/")[4], routed.split("/")[5:]
    assert prefix == ["api", "v1", "sagas"] and suffix == ["history"] and unquote(kept) == saga_id


def _app() -> Starlette:
    async def one(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"saga {request.path_params['saga_id']}")

    async def history(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"history {request.path_params['saga_id']}")

    routes = [Route("/sagas/{saga_id:saga_id}", one), Route("/sagas/{saga_id:saga_id}/history", history)]
    app = Starlette(routes=routes)
    app.add_middleware(SagaIdPaths)
    return app


@pytest.mark.asyncio
@pytest.mark.parametrize("saga_id", ODD_IDS)
async def test_any_saga_id_reaches_its_routes_and_no_other(saga_id: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://console") as client:
        one = await client.get(f"/sagas/{saga_segment(saga_id)}")
        assert (one.status_code, one.text) == (200, f"saga {saga_id}")
        history = await client.get(f"/sagas/{saga_segment(saga_id)}/history")
        assert (history.status_code, history.text) == (200, f"history {saga_id}")
