"""The latency curve names the highest rate kept up with at p99 under 1 s, and draws it."""

from __future__ import annotations

from pathlib import Path

from bench.curve import Rung, draw, markdown, sustained_maximum
from bench.runs import RunSummary


def _run(achieved: float, p99_ms: float) -> RunSummary:
    return RunSummary(sagas_per_s=achieved, p50_ms=p99_ms / 2, p95_ms=p99_ms * 0.9, p99_ms=p99_ms,
                      cpu_percent=50.0, cpu_ms_per_saga=5.0, fold_events_per_s=1.0, wal_bytes_per_saga=27_000)


LADDER = [Rung(10, _run(10, 80)), Rung(200, _run(199, 240)), Rung(400, _run(396, 900)),
          Rung(600, _run(480, 700)),  # p99 under 1 s, but it fell behind its rate
          Rung(None, _run(780, 4000))]


def test_the_sustained_maximum_keeps_up_with_its_rate_at_p99_under_a_second() -> None:
    best = sustained_maximum(LADDER)
    assert best is not None and best.offered == 400


def test_no_rung_sustained_is_none_and_the_unpaced_rung_never_counts() -> None:
    assert sustained_maximum([Rung(100, _run(100, 1500)), Rung(None, _run(800, 300))]) is None


def test_the_markdown_table_has_a_row_per_rung_and_the_maximum_in_bold() -> None:
    lines = markdown(LADDER).splitlines()
    assert len(lines) == 2 + len(LADDER)
    assert lines[4].startswith("| **400** | **396** |") and "27.0" in lines[4]
    assert lines[-1].startswith("| unpaced | 780 |")


def test_the_curve_is_drawn_as_a_png(tmp_path: Path) -> None:
    path = tmp_path / "curve.png"
    draw(LADDER, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
