"""Any saga id as one segment of a console path (an ASGI middleware and a route convertor).

A saga id may hold any character but NUL (``schemas.limits.id_problem``): ``/``, ``?``, ``#``, ``%``, spaces,
any script. A link names the saga as one segment quoted whole (``saga_segment``, the client's: ``a/b`` is
``a%2Fb``). The ASGI server decodes a path before routing, so ``/sagas/a%2Fb`` would reach the routes as
``/sagas/a/b``: two segments, and no saga. Under the saga prefixes, ``SagaIdPaths`` decodes the raw path again
but leaves ``%2F`` and ``%25`` as sent, so a segment stays one segment; routes take the id with
``{saga_id:saga_id}`` (``SAGA_PATH``), whose convertor decodes those two. No id is ambiguous with a sub-route
(``a/history`` is ``a%2Fhistory``, never the history of ``a``).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from starlette.convertors import Convertor, register_url_convertor

from ..client.api import saga_segment
from .guard import ASGIApp, Receive, Scope, Send

__all__ = ["SAGA_PATH", "SagaIdConvertor", "SagaIdPaths", "routing_path", "saga_segment"]

SAGA_PREFIXES = ("/sagas/", "/api/v1/sagas/")
SAGA_PATH = "/sagas/{saga_id:saga_id}"
"""The path of one saga in a router (the pages', or the API's under its prefix); importing it registers the
convertor."""
_KEPT = re.compile(r"(%2[fF]|%25)")


def routing_path(raw_path: str) -> str:
    """The raw (percent-encoded) path decoded but for ``%2F`` and ``%25``, which stay as sent.

    Neither can split a UTF-8 sequence (both are ASCII), so the parts between them decode on their own.
    """
    return "".join(part if _KEPT.fullmatch(part) else unquote(part) for part in _KEPT.split(raw_path))


class SagaIdConvertor(Convertor[str]):
    """One path segment as ``routing_path`` leaves it, decoded to the saga id."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return saga_segment(value)


register_url_convertor("saga_id", SagaIdConvertor())


class SagaIdPaths:
    """Routes the saga pages and API on ``routing_path`` of the raw path (every other path as the server
    decoded it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path")
        if scope["type"] in ("http", "websocket") and raw is not None and scope["path"].startswith(SAGA_PREFIXES):
            path = routing_path(raw.decode("utf-8", "replace"))
            root = scope.get("root_path", "")
            scope = dict(scope, path=path[len(root):] if root and path.startswith(root) else path)
        await self.app(scope, receive, send)
