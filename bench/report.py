"""The throughput benchmark's report: headline numbers, latency percentiles overall and over time, CPU per
process (Postgres split by client)."""

from __future__ import annotations

import argparse
import os
from collections import Counter

from rich.console import Console
from rich.table import Table

from bench.probes import MACHINE, percentile
from bench.runs import RunSummary
from bench.watch import Observed

console = Console()


def with_backend_split(cpu: dict[str, float], split: dict[str, float]) -> dict[str, float]:
    """``cpu`` with a row per client application inserted after the bench database's backends row."""
    rows: dict[str, float] = {}
    for label, used in cpu.items():
        rows[label] = used
        if label.startswith("  of which"):
            rows.update((f"    for {application}", value) for application, value in split.items())
    return rows


def ms(seconds: float) -> str:
    """Seconds as a millisecond figure."""
    return f"{seconds * 1000:,.0f}"


def report(args: argparse.Namespace, saga_ids: list[str], seen: Observed, wall_s: float,
           messages: dict[str, int], handled: int, timeouts: int, cpu: dict[str, float],
           fold: tuple[float, int], wal_bytes: int) -> RunSummary | None:
    """Print the results; return the headline numbers (None when no saga ended)."""
    ended = [s for s in saga_ids if s in seen.terminal_at]
    if not ended:
        console.print("[red]no saga ended: nothing to report")
        return None
    summary = Table("measure", "value", title=f"{len(saga_ids)} happy trip sagas, rate "
                    f"{args.rate or 'unlimited'}/s, {args.partitions} partitions")
    summary.add_row("sagas ended / wall time", f"{len(ended)} / {wall_s:.2f} s"
                    + (f"  ({len(saga_ids) - len(ended)} did not end)" if len(ended) < len(saga_ids) else ""))
    summary.add_row("[bold]sagas/s sustained", f"[bold]{len(ended) / wall_s:,.1f}")
    summary.add_row("outcomes", ", ".join(f"{k}: {v}" for k, v in sorted(Counter(seen.outcome[s] for s in ended)
                                                                         .items())))
    summary.add_row("step timeouts (StepTimedOut events)", str(timeouts))
    relayed = sum(v for k, v in messages.items() if k != "start")
    summary.add_row("relay msgs/s (events + commands + results)",
                    f"{relayed / wall_s:,.0f}  ({messages['events']:,} + {messages['commands']:,} + "
                    f"{messages['results']:,} msgs)")
    summary.add_row("orchestrator msgs handled/s (inbox rows)", f"{handled / wall_s:,.0f}  ({handled:,} msgs)")
    summary.add_row("Postgres WAL written (whole server)",
                    f"{wal_bytes / len(ended):,.0f} bytes per saga  ({wal_bytes / 1e6:,.1f} MB)")
    folds, length = fold
    summary.add_row(f"fold events/s (in-process, {length}-event trip)", f"{folds:,.0f}")
    console.print(summary)

    latency = Table("latency (ms)", "p50", "p95", "p99", "max", title="saga latency")
    observed = sorted(seen.terminal_at[s] - seen.published_at[s] for s in ended)
    recorded = sorted((seen.terminal_ms[s] - seen.started_at_ms[s]) / 1000 for s in ended if s in seen.started_at_ms)
    for name, values in (("publish → terminal on Kafka", observed), ("SagaStarted → terminal (occurred_at)", recorded)):
        latency.add_row(name, *(ms(percentile(values, q)) for q in (0.50, 0.95, 0.99)), ms(values[-1]))
    console.print(latency)
    console.print(latency_over_time(ended, seen))

    usage = Table("process", "cpu s", "% of one core", "ms per saga",
                  title=f"CPU during the run ({os.cpu_count()} cores)")
    machine = cpu.pop(MACHINE, 0.0)
    ours = sum(used for label, used in cpu.items() if not label.startswith(" "))

    def row(label: str, used: float) -> None:
        usage.add_row(label, f"{used:.1f}", f"{100 * used / wall_s:.0f}%", f"{1000 * used / len(ended):.1f}")

    for label, used in cpu.items():
        row(label, used)
    row("total of the above", ours)
    row("rest of the machine", max(0.0, machine - ours))
    console.print(usage)
    return RunSummary(sagas_per_s=len(ended) / wall_s, p50_ms=1000 * percentile(observed, 0.50),
                      p95_ms=1000 * percentile(observed, 0.95), p99_ms=1000 * percentile(observed, 0.99),
                      cpu_percent=100 * ours / wall_s, cpu_ms_per_saga=1000 * ours / len(ended),
                      fold_events_per_s=folds, wal_bytes_per_saga=wal_bytes / len(ended))


def latency_over_time(ended: list[str], seen: Observed, rows: int = 15) -> Table:
    """Latency percentiles by when the sagas were published: a stall shows as a few slow rows, a backlog
    as a steady climb."""
    first = min(seen.published_at[s] for s in ended)
    span = max(seen.published_at[s] for s in ended) - first
    width = max(span / rows, 0.5)
    buckets: dict[int, list[float]] = {}
    for saga_id in ended:
        index = min(int((seen.published_at[saga_id] - first) / width), rows - 1)
        buckets.setdefault(index, []).append(seen.terminal_at[saga_id] - seen.published_at[saga_id])
    table = Table("published at (s)", "sagas", "p50 ms", "p99 ms", "max ms", title="latency over time")
    for index in sorted(buckets):
        values = sorted(buckets[index])
        table.add_row(f"{index * width:.1f} to {(index + 1) * width:.1f}", str(len(values)),
                      ms(percentile(values, 0.5)), ms(percentile(values, 0.99)), ms(values[-1]))
    return table
