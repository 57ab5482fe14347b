"""Latency against load: the trip at a ladder of rates, each rung on a fresh stack.

    python -m bench.curve [--rates 10,50,100,200,400,600] [--seconds 20] [--unpaced 3000]
                          [--png docs/curve.png] [--participants SPEC]

Each rung is one ``bench.throughput`` run (a fresh database, topic prefix and services, warmed up, then
``rate * seconds`` sagas paced at ``rate``; the last rung publishes ``--unpaced`` sagas at once). The end is a
table, per rung: offered and achieved sagas/s, saga latency p50 / p95 / p99 (publish → terminal event on
Kafka), CPU per saga and cores busy (every service, Kafka and Postgres), and Postgres WAL bytes per saga;
the sustained maximum, the highest offered rate whose p99 stayed under 1 s while keeping up, is named and
marked on the curve, which is drawn as a PNG (achieved sagas/s against latency, log scale). The same table is
printed as Markdown for the README.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import uvloop
from rich.table import Table

from bench import throughput
from bench.report import console
from bench.runs import RunSummary
from saga_orchestrator.infra.logging import configure_logging
from saga_orchestrator.infra.settings import Settings

DEFAULT_RATES = (10.0, 50.0, 100.0, 200.0, 400.0, 600.0)
SUSTAINED_P99_MS = 1000.0
KEEPS_UP = 0.9  # achieved / offered: below this the rung fell behind, whatever its latency
MIN_SAGAS = 150  # a rung's percentiles need a few hundred sagas; slow rungs run longer than --seconds


@dataclass(frozen=True)
class Rung:
    """One rate of the ladder and what it measured; ``offered`` is None for the unpaced rung."""

    offered: float | None
    run: RunSummary

    @property
    def sustained(self) -> bool:
        """Kept up with its rate with p99 under ``SUSTAINED_P99_MS``."""
        return (self.offered is not None and self.run.p99_ms < SUSTAINED_P99_MS
                and self.run.sagas_per_s >= KEEPS_UP * self.offered)


def sustained_maximum(rungs: list[Rung]) -> Rung | None:
    """The rung of the highest offered rate that was sustained (see ``Rung.sustained``), None if none was."""
    sustained = [rung for rung in rungs if rung.sustained]
    return max(sustained, key=lambda rung: rung.offered or 0.0, default=None)


def _cells(rung: Rung) -> list[str]:
    run = rung.run
    return ["unpaced" if rung.offered is None else f"{rung.offered:,.0f}", f"{run.sagas_per_s:,.0f}",
            f"{run.p50_ms:,.0f}", f"{run.p95_ms:,.0f}", f"{run.p99_ms:,.0f}", f"{run.cpu_ms_per_saga:.1f}",
            f"{run.cpu_percent / 100:.2f}", f"{run.wal_bytes_per_saga / 1000:,.1f}"]


HEADERS = ["offered sagas/s", "achieved sagas/s", "p50 ms", "p95 ms", "p99 ms", "CPU ms per saga",
           "cores busy", "WAL kB per saga"]


def curve_table(rungs: list[Rung]) -> Table:
    """The ladder as a rich table, the sustained maximum in bold."""
    best = sustained_maximum(rungs)
    table = Table(*HEADERS, title="latency against load (p99 < 1 s and keeping up: sustained)")
    for rung in rungs:
        cells = _cells(rung)
        table.add_row(*([f"[bold]{cell}" for cell in cells] if rung is best else cells))
    return table


def markdown(rungs: list[Rung]) -> str:
    """The ladder as a Markdown table (the sustained maximum in bold), as the README shows it."""
    best = sustained_maximum(rungs)
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for rung in rungs:
        cells = _cells(rung)
        lines.append("| " + " | ".join(f"**{cell}**" if rung is best else cell for cell in cells) + " |")
    return "\n".join(lines)


def draw(rungs: list[Rung], path: Path) -> None:
    """Achieved sagas/s against p50 / p95 / p99 (log scale), the sustained maximum marked."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt

    paced = [rung for rung in rungs if rung.offered is not None]
    figure, axes = plt.subplots(figsize=(8, 4.8), dpi=110)
    rates = [rung.run.sagas_per_s for rung in paced]
    for label, field, style in (("p50", "p50_ms", "o-"), ("p95", "p95_ms", "s--"), ("p99", "p99_ms", "^-")):
        axes.plot(rates, [float(getattr(rung.run, field)) for rung in paced], style, label=label)
    for rung in rungs:
        if rung.offered is None:
            axes.plot([rung.run.sagas_per_s], [rung.run.p50_ms], "kx", markersize=9,
                      label=f"unpaced p50 ({rung.run.sagas_per_s:,.0f} sagas/s)")
    if (best := sustained_maximum(rungs)) is not None:
        axes.axvline(best.run.sagas_per_s, color="grey", linestyle=":")
        axes.annotate(f"sustained max {best.offered:,.0f}/s\n(p99 {best.run.p99_ms:,.0f} ms)",
                      (best.run.sagas_per_s, best.run.p99_ms), textcoords="offset points", xytext=(-110, 20))
    axes.axhline(SUSTAINED_P99_MS, color="red", linewidth=0.8, linestyle="--", label="1 s")
    axes.set_yscale("log")
    axes.set_xlabel("achieved sagas/s")
    axes.set_ylabel("trip latency, publish → terminal event (ms)")
    axes.set_title("trip saga: latency against load")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


def rung_args(args: argparse.Namespace, rate: float | None) -> argparse.Namespace:
    """The ``bench.throughput`` arguments of one rung."""
    sagas = args.unpaced if rate is None else max(MIN_SAGAS, int(rate * args.seconds))
    options = ["--sagas", str(sagas), "--partitions", str(args.partitions), "--timeout", str(args.timeout)]
    options += [] if rate is None else ["--rate", str(rate)]
    options += [] if args.participants is None else ["--participants", args.participants]
    options += [] if args.admin_dsn is None else ["--admin-dsn", args.admin_dsn]
    return throughput.arguments().parse_args(options)


def main() -> None:
    """Command-line entry."""
    configure_logging("WARNING", "kv")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default=",".join(f"{rate:g}" for rate in DEFAULT_RATES),
                        help="paced rates, sagas/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of sagas at each paced rate")
    parser.add_argument("--unpaced", type=int, default=3000, help="sagas published at once last (0: no such rung)")
    parser.add_argument("--png", type=Path, default=Path("docs/curve.png"), help="where to draw the curve")
    parser.add_argument("--partitions", type=int, default=Settings().saga_topic_partitions)
    parser.add_argument("--participants", default=None, help="participant workers, as SAGA_PARTICIPANTS")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for a rung's sagas to end")
    parser.add_argument("--admin-dsn", default=None, help="DSN allowed to CREATE DATABASE (default: DATABASE_URL)")
    args = parser.parse_args()
    try:
        rates: list[float | None] = [float(rate) for rate in args.rates.split(",") if rate.strip()]
    except ValueError:
        parser.error(f"--rates must be numbers separated by commas, got {args.rates!r}")
    if any(rate is not None and rate <= 0 for rate in rates):
        parser.error("every rate in --rates must be above 0")
    if args.unpaced:
        rates.append(None)
    rungs = []
    for number, rate in enumerate(rates, start=1):
        console.rule(f"rung {number} of {len(rates)}: {'unpaced' if rate is None else f'{rate:g} sagas/s'}")
        if (summary := uvloop.run(throughput.run(rung_args(args, rate)))) is not None:
            rungs.append(Rung(rate, summary))
    console.rule("the curve")
    console.print(curve_table(rungs))
    best = sustained_maximum(rungs)
    console.print("sustained maximum (p99 < 1 s, keeping up): "
                  + ("none of the rates" if best is None else f"[bold]{best.offered:,.0f} sagas/s"))
    draw(rungs, args.png)
    console.print(f"curve drawn in {args.png}")
    print(markdown(rungs))  # plain: a terminal-wide console would wrap the table's lines


if __name__ == "__main__":
    main()
