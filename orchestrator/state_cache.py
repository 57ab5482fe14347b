"""Folded saga states kept between transactions, within a memory budget.

A cached state is always a prefix of the stored history (only states whose transaction committed go in), and
each transaction still reads the events recorded after it, so a stale entry costs a read, never a wrong
decision.
"""

from __future__ import annotations

from collections import OrderedDict

from .domain.state import SagaState

STATE_CACHE_BYTES = 256 * 1024 * 1024
"""How much memory the cache of folded states may take (estimated per state by ``state_bytes``)."""


def state_bytes(state: SagaState) -> int:
    """An estimate of the memory a folded state takes: its input, outputs and texts, and a fixed overhead for
    the objects around them (a four-step trip state with a tiny input measures about 2 kB, as estimated)."""
    steps = sum(320 + len(step.output or b"") + len(step.last_error_message or "") for step in state.steps.values())
    texts = sum(len(text or "") for text in (state.failure_reason, state.cancel_reason, state.quarantine_reason,
                                             state.compensation_failure_reason))
    return 700 + len(state.input) + steps + texts


class StateCache:
    """Folded states by saga id, least recently used first, held within ``max_bytes`` (``state_bytes``)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._states: OrderedDict[str, tuple[SagaState, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def get(self, saga_id: str) -> SagaState | None:
        entry = self._states.get(saga_id)
        return entry[0] if entry is not None else None

    def put(self, state: SagaState) -> None:
        self.drop(state.saga_id)
        size = state_bytes(state)
        if size > self.max_bytes:
            return  # larger than the whole cache: read again each time rather than push everything out
        self._states[state.saga_id] = (state, size)
        self.bytes += size
        while self.bytes > self.max_bytes and self._states:
            _, (_, evicted) = self._states.popitem(last=False)
            self.bytes -= evicted

    def drop(self, saga_id: str) -> None:
        entry = self._states.pop(saga_id, None)
        if entry is not None:
            self.bytes -= entry[1]
