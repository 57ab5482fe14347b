"""Who is using the console: an operator named by a trusted proxy's header, or one signed in with a local login.

Never a form field: the operator recorded with every lever comes from here. Three modes, chosen by settings:

- ``SAGA_CONSOLE_OPERATOR_HEADER`` (e.g. ``X-Forwarded-User``): a proxy in front authenticates people and names
  them in this header; a request without it is refused. Only sound when nothing but the proxy can reach the
  console (it binds 127.0.0.1 by default).
- ``SAGA_CONSOLE_USERS``: a file of ``name:scrypt-hash`` lines (``saga console add-user``); people sign in on
  ``/login`` (a session held in Postgres, ``operations.sessions``), API callers with HTTP Basic; failed checks of
  either are throttled (``console.throttle``).
- neither: anyone who reaches it may read, nobody may act (levers need an operator).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from starlette.datastructures import Headers
from starlette.requests import Request

from ..infra.misconfigured import Misconfigured
from ..operations.sessions import Sessions
from .guard import Caller, Refused, caller_of
from .throttle import SignInThrottle

HASHING_AT_ONCE = 2  # password checks at once: further guesses wait their turn, off the event loop
_N, _R, _P = 2**14, 8, 1  # scrypt cost: about 50 ms per check on this kind of machine, 16 MiB


def hash_password(password: str, salt: bytes | None = None) -> str:
    """``scrypt$<salt>$<hash>`` (base64) of ``password``."""
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P)
    return f"scrypt${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def check_password(password: str, stored: str) -> bool:
    """Whether ``password`` is the one ``stored`` (a ``hash_password`` result) was made from."""
    try:
        scheme, salt, digest = stored.split("$")
        expected = base64.b64decode(digest)
        salt_bytes = base64.b64decode(salt)
    except (ValueError, binascii.Error):
        return False
    if scheme != "scrypt":
        return False
    return hmac.compare_digest(hashlib.scrypt(password.encode(), salt=salt_bytes, n=_N, r=_R, p=_P), expected)


def read_users(path: Path) -> dict[str, str]:
    """The users file: ``name:hash`` per line, ``#`` comments; Misconfigured naming the setting when unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise Misconfigured(f"SAGA_CONSOLE_USERS={str(path)!r}: cannot read it ({error.strerror}); "
                            "make it with `saga console add-user NAME`") from None
    users: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, stored = line.strip().partition(":")
        if not sep or not name or not stored.startswith("scrypt$"):
            raise Misconfigured(f"SAGA_CONSOLE_USERS={str(path)!r}: line {number} is not name:scrypt$salt$hash "
                                "(write it with `saga console add-user NAME`)")
        users[name] = stored
    return users


def add_user(path: Path, name: str, password: str) -> None:
    """Add or replace ``name`` in the users file (made, mode 0600, when missing)."""
    if not name or ":" in name or name != name.strip():
        raise ValueError(f"user name {name!r}: give a name without ':' or surrounding spaces")
    users = read_users(path) if path.exists() else {}
    users[name] = hash_password(password)
    path.write_text("".join(f"{user}:{stored}\n" for user, stored in sorted(users.items())))
    path.chmod(0o600)


@dataclass(frozen=True)
class Identity:
    """How this console learns who its user is (see the module); ``sessions`` holds the signed-in (login mode),
    ``throttle`` counts failed password checks, from the sign-in form and HTTP Basic alike."""

    header: str | None = None
    users: dict[str, str] | None = None
    sessions: Sessions | None = None
    throttle: SignInThrottle = field(default_factory=SignInThrottle)
    clock: Callable[[], float] = time.monotonic
    decoy: str = field(default_factory=lambda: hash_password(secrets.token_urlsafe(16)))
    """What a name that is no user's is checked against: one scrypt run whatever the name."""
    hashing: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(HASHING_AT_ONCE))

    @property
    def mode(self) -> str:
        return "proxy" if self.header else "login" if self.users is not None else "anonymous"

    @staticmethod
    def operator(request: Request) -> str | None:
        """The operator making ``request`` (``console.guard`` found who asks); None when nobody is known."""
        caller = caller_of(request)
        return None if caller is None else caller.operator

    async def who(self, headers: Headers, session_token: str | None, address: str) -> Caller:
        """Who makes a request (``console.guard.WhoAsks``): the proxy's header, a live session, or HTTP Basic."""
        if self.header:
            return Caller((headers.get(self.header) or "").strip() or None)
        if self.users is None:
            return Caller(None)
        if session_token and self.sessions is not None:
            session = await self.sessions.find(session_token)
            if session is not None and session.operator in self.users:
                return Caller(session.operator, session.token, session.csrf)
        basic = _basic(headers)
        if basic is None:
            return Caller(None)
        name, password = basic
        return Caller(name if await self.sign_in(name, password, address) else None)

    async def sign_in(self, name: str, password: str, address: str) -> bool:
        """Check a local login (always False without a users file); Refused 429 while ``name`` or ``address``
        is locked (``console.throttle``)."""
        wait = self.throttle.retry_after(name, address, self.clock())
        if wait is not None:
            raise Refused(429, f"too many failed sign-ins: try again in {math.ceil(wait)} s",
                          {"Retry-After": str(math.ceil(wait))})
        stored = (self.users or {}).get(name)
        async with self.hashing:  # scrypt runs take tens of ms of CPU: in worker threads, a few at a time
            matches = await asyncio.to_thread(check_password, password, stored or self.decoy)
        accepted = matches and stored is not None
        if accepted:
            self.throttle.succeeded(name, address)
        else:
            self.throttle.failed(name, address, self.clock())
        return accepted


def _basic(headers: Headers) -> tuple[str, str] | None:
    scheme, _, encoded = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        name, _, password = base64.b64decode(encoded).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return name, password
