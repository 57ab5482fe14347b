"""How often someone may guess a password: failed sign-ins counted per name and address, and per address.

A name is never locked out everywhere: failures lock the pair (name, address) they came from, so an attacker's
guesses at someone's name from one address do not keep that person out from theirs. An address that fails too
often with any names is locked as a whole (guessing many names from one place). Both locks last ``LOCK_S``
from the failure that set them; a sign-in that succeeds clears its pair's failures. Counts live in the console
process (a restart forgets them; each replica counts its own).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

PAIR_FAILURES = 5
"""Failed sign-ins of one name from one address within ``WINDOW_S`` that lock that pair."""
ADDRESS_FAILURES = 20
"""Failed sign-ins from one address (any names) within ``WINDOW_S`` that lock the address."""
WINDOW_S = 900.0
LOCK_S = 900.0
MAX_TRACKED = 10_000  # pairs and addresses remembered at most: the oldest are forgotten first


@dataclass
class SignInThrottle:
    """Failed sign-ins by (name, address) and by address; ``retry_after`` says whether one may try now.

    Pure: the caller passes the clock (seconds, monotonic), so tests run it without waiting."""

    pair_failures: int = PAIR_FAILURES
    address_failures: int = ADDRESS_FAILURES
    window_s: float = WINDOW_S
    lock_s: float = LOCK_S
    _pairs: dict[tuple[str, str], deque[float]] = field(default_factory=dict)
    _addresses: dict[str, deque[float]] = field(default_factory=dict)

    def retry_after(self, name: str, address: str, now: float) -> float | None:
        """Seconds until ``name`` may try again from ``address``; None when it may now."""
        waits = [wait for wait in (self._locked_for(self._pairs.get((name, address)), now),
                                   self._locked_for(self._addresses.get(address), now)) if wait is not None]
        return max(waits, default=None)

    def failed(self, name: str, address: str, now: float) -> None:
        """Count a failed sign-in of ``name`` from ``address``."""
        _count(self._pairs, (name, address), self.pair_failures, now)
        _count(self._addresses, address, self.address_failures, now)

    def succeeded(self, name: str, address: str) -> None:
        """A sign-in of ``name`` from ``address`` succeeded: that pair starts afresh (the address keeps its count)."""
        self._pairs.pop((name, address), None)

    def _locked_for(self, failures: deque[float] | None, now: float) -> float | None:
        """Locked: the last ``maxlen`` failures (a full deque) came within ``window_s``, the last under ``lock_s``
        ago."""
        if failures is None or len(failures) < (failures.maxlen or 0):
            return None
        if failures[-1] - failures[0] > self.window_s:
            return None
        remaining = failures[-1] + self.lock_s - now
        return remaining if remaining > 0 else None


def _count(table: dict[Any, deque[float]], key: Any, limit: int, now: float) -> None:
    failures = table.pop(key, None) or deque(maxlen=limit)
    failures.append(now)
    table[key] = failures  # re-inserted: the dict's order is the order of last use
    while len(table) > MAX_TRACKED:
        table.pop(next(iter(table)))
