"""Repeated runs of the throughput benchmark, side by side.

On a small machine one run says little: on the 2-core reference machine, one commit at 210 sagas/s gave p99
from 0.55 to 2.8 s within an hour, and the CPU each saga took from 5.9 to 9.3 ms: the same work, so the
machine itself changed speed. The in-process fold probe each run starts with (one core, nothing else
running) read from 91,000 to 175,000 events/s over that hour, but it does not foresee a slow run; the CPU per
saga is the better gauge. ``--runs N`` repeats the run and ends with this table: every run's headline
numbers and the probe's reading, their median, and their range.
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
    fold_events_per_s: float  # the machine's speed just before the run (bench.probes.fold_events_per_s)
    wal_bytes_per_saga: float = 0.0  # Postgres WAL written during the run (whole server), per saga


_COLUMNS: tuple[tuple[str, Callable[[RunSummary], float], str], ...] = (
    ("sagas/s", lambda run: run.sagas_per_s, "{:,.1f}"),
    ("p50 ms", lambda run: run.p50_ms, "{:,.0f}"),
    ("p95 ms", lambda run: run.p95_ms, "{:,.0f}"),
    ("p99 ms", lambda run: run.p99_ms, "{:,.0f}"),
    ("CPU % of one core", lambda run: run.cpu_percent, "{:.0f}%"),
    ("CPU ms per saga", lambda run: run.cpu_ms_per_saga, "{:.1f}"),
    ("WAL bytes per saga", lambda run: run.wal_bytes_per_saga, "{:,.0f}"),
    ("fold ev/s", lambda run: run.fold_events_per_s, "{:,.0f}"),
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
