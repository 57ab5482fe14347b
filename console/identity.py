"""Who is using the console: an operator named by a trusted proxy's header, or one signed in with a local login.

Never a form field: the operator recorded with every lever comes from here. Three modes, chosen by settings:

- ``SAGA_CONSOLE_OPERATOR_HEADER`` (e.g. ``X-Forwarded-User``): a proxy in front authenticates people and names
  them in this header; a request without it is refused. Only sound when nothing but the proxy can reach the
  console (it binds 127.0.0.1 by default).
- ``SAGA_CONSOLE_USERS``: a file of ``name:scrypt-hash`` lines (``saga console add-user``); people sign in on
  ``/login`` (a signed session cookie), API callers with HTTP Basic.
- neither: anyone who reaches it may read, nobody may act (levers need an operator).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from ..infra.misconfigured import Misconfigured

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
    """How this console learns who its user is (see the module)."""

    header: str | None = None
    users: dict[str, str] | None = None

    @property
    def mode(self) -> str:
        return "proxy" if self.header else "login" if self.users is not None else "anonymous"

    def operator(self, request: Request) -> str | None:
        """The operator making ``request``; None when unknown (not signed in, or anonymous mode)."""
        if self.header:
            name = request.headers.get(self.header, "").strip()
            return name or None
        if self.users is None:
            return None
        signed_in = request.session.get("operator")
        if isinstance(signed_in, str) and signed_in in self.users:
            return signed_in
        return self._basic(request)

    def sign_in(self, name: str, password: str) -> bool:
        """Check a local login (always False without a users file)."""
        stored = (self.users or {}).get(name)
        if stored is None:
            check_password(password, hash_password("not a user"))  # the same time for a wrong name
            return False
        return check_password(password, stored)

    def _basic(self, request: Request) -> str | None:
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            name, _, password = base64.b64decode(encoded).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return name if self.sign_in(name, password) else None
