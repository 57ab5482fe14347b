"""Repeated runs of the throughput benchmark, side by side.

On a small machine one run says little: the same code and settings gave p99 from 1.1 to 2.7 s at 200 sagas/s
on the 2-core reference machine, a spread as large as most effects worth measuring. ``--runs N`` repeats the
run and ends with this table: every run's headline numbers, their median, and their range.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.table import Table


@dataclass(frozen=True)
class RunSummary:
    """The headline numbers of one run."""

    sagas_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    cpu_percent: float  # of one core, every watched process together
    cpu_ms_per_saga: float


_COLUMNS: tuple[tuple[str, Callable[[RunSummary], float], str], ...] = (
    ("sagas/s", lambda run: run.sagas_per_s, "{:,.1f}"),
    ("p50 ms", lambda run: run.p50_ms, "{:,.0f}"),
    ("p95 ms", lambda run: run.p95_ms, "{:,.0f}"),
    ("p99 ms", lambda run: run.p99_ms, "{:,.0f}"),
    ("CPU % of one core", lambda run: run.cpu_percent, "{:.0f}%"),
    ("CPU ms per saga", lambda run: run.cpu_ms_per_saga, "{:.1f}"),
)


def runs_table(runs: Sequence[RunSummary]) -> Table:
    """One row per run, then the median and the range (min to max) of every column."""
    table = Table("run", *(title for title, _, _ in _COLUMNS), title=f"{len(runs)} runs")
    for number, run in enumerate(runs, start=1):
        table.add_row(str(number), *(fmt.format(value(run)) for _, value, fmt in _COLUMNS))
    if runs:
        columns = [[value(run) for run in runs] for _, value, _ in _COLUMNS]
        formats = [fmt for _, _, fmt in _COLUMNS]
        table.add_row("[bold]median", *(f"[bold]{fmt.format(statistics.median(values))}"
                                        for fmt, values in zip(formats, columns, strict=True)))
        table.add_row("min to max", *(f"{fmt.format(min(values))} to {fmt.format(max(values))}"
                                      for fmt, values in zip(formats, columns, strict=True)))
    return table
