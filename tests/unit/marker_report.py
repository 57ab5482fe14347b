"""A pytest plugin for tests/unit/test_markers.py: prints ``MARKS <marker,...> <node id>`` per collected test."""

from __future__ import annotations

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        print(f"MARKS {','.join(sorted({mark.name for mark in item.iter_markers()})) or '-'} {item.nodeid}")
