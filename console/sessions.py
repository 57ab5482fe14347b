"""The console's sign-ins: ``operations.sessions`` (held in ``saga.console_sessions``, ended at sign-out)."""

from __future__ import annotations

from ..operations.sessions import SESSION_S, Session, Sessions, memory_sessions

__all__ = ["SESSION_S", "Session", "Sessions", "memory_sessions"]
