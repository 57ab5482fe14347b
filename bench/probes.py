"""Measuring helpers of the throughput benchmark: CPU per process, percentiles, the fold micro-benchmark."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from saga_orchestrator.orchestrator.domain.decide import decide
from saga_orchestrator.orchestrator.domain.messages import IncomingMessage
from saga_orchestrator.orchestrator.domain.state import SagaState, fold
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas.event_types import Event
from saga_orchestrator.schemas.message_types import CommandKind, ResultStatus, StartSaga, StepResult

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int, with_children: bool = False) -> float:
    """CPU seconds (user + system) a process has used so far; 0 when it is gone or unreadable.

    ``with_children`` adds the reaped children's time (Postgres backends that have exited).
    """
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name may contain spaces: fields are counted after its closing parenthesis.
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
    ticks = utime + stime + (cutime + cstime if with_children else 0)
    return ticks / TICKS_PER_S


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (e.g. the backends of a Postgres postmaster)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found.append(int(entry))
    return found


def command_line(pid: int) -> str:
    """The process's command line as one string ('' when gone); Postgres backends show their database."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class Watched:
    """A process whose CPU time is sampled; ``tree`` sums its children too (Postgres), only those whose
    command line contains ``only`` when given (the backends of one database)."""

    label: str
    pid: int
    tree: bool = False
    only: str = ""

    def cpu_s(self) -> float:
        """CPU seconds used so far by the process (and, for a tree, its live and reaped children)."""
        if not self.tree:
            return process_cpu_s(self.pid)
        children = children_of(self.pid)
        if self.only:  # live backends of one database: one that exited in between is not counted
            return sum(process_cpu_s(child) for child in children if self.only in command_line(child))
        return process_cpu_s(self.pid, with_children=True) + sum(
            process_cpu_s(child, with_children=True) for child in children
        )


def backend_cpu(postmaster: int) -> dict[int, float]:
    """CPU seconds used so far by each live child of the Postgres postmaster, by pid."""
    return {child: process_cpu_s(child) for child in children_of(postmaster)}


def cpu_by_application(before: Mapping[int, float], after: Mapping[int, float],
                       applications: Mapping[int, str]) -> dict[str, float]:
    """Backend CPU used between two ``backend_cpu`` samples, summed per ``application_name`` (backends
    started in between count from zero; those that exited in between are not counted)."""
    used: dict[str, float] = {}
    for pid, application in applications.items():
        if pid in after:
            used[application] = used.get(application, 0.0) + max(0.0, after[pid] - before.get(pid, 0.0))
    return dict(sorted(used.items()))


MACHINE = "whole machine"


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (every core, every process), from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / TICKS_PER_S  # guest time is already counted in user


def sample_cpu(watched: Sequence[Watched]) -> dict[str, float]:
    """CPU seconds per label, now, plus the whole machine's busy time under ``MACHINE``."""
    return {**{w.label: w.cpu_s() for w in watched}, MACHINE: machine_cpu_s()}


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds used per label between two samples."""
    return {label: max(0.0, after.get(label, 0.0) - used) for label, used in before.items()}


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (``fraction`` in 0..1); NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(fraction * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def happy_trip_history() -> list[Event]:
    """The events of one happy trip saga, produced by driving the pure core (10 events)."""
    saga_id = "bench-fold"
    now = 1_700_000_000_000
    state: SagaState | None = None
    events: list[Event] = []

    def step(message: IncomingMessage) -> None:
        nonlocal state, now
        now += 5
        decision = decide(TRIP, state, message, now)
        events.extend(decision.events)
        state = decision.state

    step(StartSaga(saga_id=saga_id, saga_type="trip", tenant_id=None, input=b"\x00"))
    for name in ("book_flight", "book_hotel", "charge_card", "send_itinerary"):
        step(StepResult(saga_id=saga_id, step=name, kind=CommandKind.FORWARD,
                        idempotency_key=f"{saga_id}:{name}", attempt=1, status=ResultStatus.SUCCEEDED))
    return events


def fold_events_per_s(seconds: float = 1.0) -> tuple[float, int]:
    """Fold a happy trip history repeatedly for ``seconds``; returns (events folded per second, history
    length)."""
    history = happy_trip_history()
    for _ in range(200):  # warm up
        fold(TRIP, history)
    folds = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(200):
            fold(TRIP, history)
        folds += 200
    return folds * len(history) / elapsed, len(history)
