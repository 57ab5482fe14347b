"""What every request to the console passes before a page or the API sees it (an ASGI middleware).

In this order, each refusal a plain 4xx that changed nothing:

1. The request is well formed: no NUL in its path or query (400), a body of at most ``MAX_BODY`` bytes (413),
   and no NUL in a form's or a JSON body's values (400). Postgres refuses NUL in text, so a NUL reaching a
   query would answer 500, or fail an audit write after its lever went out.
2. Who asks is known (``Caller``): the session named by the cookie (``operations.sessions``), the trusted proxy's
   header, or HTTP Basic, whose password check is throttled (``console.throttle``) and runs off the event loop.
3. A request that changes something comes from the console's own pages: a browser's ``Sec-Fetch-Site`` is
   ``same-origin`` (or ``none``: typed by the user), its ``Origin`` is the console's; and a request of a
   signed-in session echoes the session's CSRF token (header ``X-CSRF-Token`` or form field ``csrf_token``).
   A page on another port of the same host is same-site, so SameSite cookies alone would let it act.

Every response says it may not be framed, its type is not to be sniffed and it sends the path of no page to
other sites (``SECURITY_HEADERS``).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from starlette.datastructures import Headers
from starlette.requests import cookie_parser

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY = 64 * 1024
"""The largest request body the console takes (its largest form, a signal's payload, is far smaller)."""
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
PUBLIC_PREFIX = "/static/"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SECURITY_HEADERS = [
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


@dataclass(frozen=True)
class Caller:
    """Who makes a request: ``operator`` (None: nobody known) and, for a signed-in session, its token and the
    CSRF token its changes must send."""

    operator: str | None
    session_token: str | None = None
    csrf: str | None = None


def caller_of(request: Any) -> Caller | None:
    """Who makes ``request`` (a Starlette request the guard passed); None outside the guard."""
    caller: Caller | None = getattr(request.state, "caller", None)
    return caller


class Refused(Exception):
    """A request the guard answers itself: ``status`` and a one-line ``detail``."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


WhoAsks = Callable[[Headers, str | None, str], Awaitable[Caller]]
"""(the request's headers, its session cookie, the client's address) -> who asks; raises Refused (a throttled
sign-in). The console's ``Identity.who``."""


class Guard:
    """The middleware (see the module): ``who_asks`` is looked up on the app's state when a request comes (the
    console is made when the app starts); ``cookie`` is the session cookie's name."""

    def __init__(self, app: ASGIApp, who_asks: Callable[[Scope], WhoAsks], cookie: str) -> None:
        self._app = app
        self._who_asks = who_asks
        self._cookie = cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        try:
            receive = await self._checked(scope, receive)
        except Refused as refused:
            await _answer(send_secured, refused)
            return
        await self._app(scope, receive, send_secured)

    async def _checked(self, scope: Scope, receive: Receive) -> Receive:
        """The request's body, replayed (or ``receive`` untouched for a bodiless method), once it passed; who asks
        is left in ``scope["state"]["caller"]``."""
        headers = Headers(scope=scope)
        query = scope.get("query_string", b"")
        if "\x00" in scope["path"] or b"%00" in query or b"\x00" in query:
            raise Refused(400, "a NUL character is not accepted in a path or a query")
        unsafe = scope["method"] in UNSAFE_METHODS
        if not unsafe and scope["path"].startswith(PUBLIC_PREFIX):
            return receive  # the pages' stylesheet and scripts: nobody's, no lookup
        body = await _body(headers, receive) if unsafe else None
        if body is not None:
            _refuse_nul(headers, body)
        token = cookie_parser(headers.get("cookie", "")).get(self._cookie)
        client = scope.get("client")
        caller = await self._who_asks(scope)(headers, token, client[0] if client else "?")
        scope.setdefault("state", {})["caller"] = caller
        if unsafe:
            _same_origin(headers, scope)
            if caller.csrf is not None and not _echoes(caller.csrf, headers, body or b""):
                raise Refused(403, "this change did not come from the console's own page (no valid CSRF token): "
                                   "reload the page and try again")
        if body is None:
            return receive
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # what follows the body: a disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return replay


async def _body(headers: Headers, receive: Receive) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise Refused(413, f"a request body is at most {MAX_BODY} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, "the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise Refused(413, f"a request body is at most {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _form(headers: Headers, body: bytes) -> dict[str, str]:
    if headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return {}
    try:
        return dict(parse_qsl(body.decode(), keep_blank_values=True))
    except UnicodeDecodeError:
        raise Refused(400, "the form is not UTF-8") from None


def _refuse_nul(headers: Headers, body: bytes) -> None:
    if b"\x00" in body or any("\x00" in key or "\x00" in value for key, value in _form(headers, body).items()):
        raise Refused(400, "a NUL character is not accepted in a form")
    if headers.get("content-type", "").split(";")[0].strip() == "application/json" and b"\\u0000" in body:
        try:
            parsed = json.loads(body)
        except ValueError:
            return  # the API answers what is wrong with it
        if _holds_nul(parsed):
            raise Refused(400, "a NUL character (\\u0000) is not accepted in a JSON value")


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(key) or _holds_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_holds_nul(item) for item in value)
    return False


def _same_origin(headers: Headers, scope: Scope) -> None:
    """Refused unless the browser says the request comes from the console's own origin (a client that is no
    browser sends neither header and is judged by its credentials alone)."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise Refused(403, f"a change from another site or origin is refused (Sec-Fetch-Site: {site})")
    origin = headers.get("origin")
    if origin is None:
        return
    host = headers.get("host", "")
    own = {f"{scheme}://{host}" for scheme in ("http", "https")}
    if origin == "null" or origin not in own:
        shown = urlsplit(origin).netloc or origin
        raise Refused(403, f"a change from another origin ({shown[:100]}) is refused")


def _echoes(csrf: str, headers: Headers, body: bytes) -> bool:
    sent = headers.get(CSRF_HEADER) or _form(headers, body).get(CSRF_FIELD, "")
    return hmac.compare_digest(sent.encode(), csrf.encode())


async def _answer(send: Send, refused: Refused) -> None:
    body = json.dumps({"detail": refused.detail}).encode()
    extra = [(name.lower().encode(), value.encode()) for name, value in refused.headers.items()]
    await send({"type": "http.response.start", "status": refused.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": body})
