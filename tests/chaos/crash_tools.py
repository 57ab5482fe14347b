"""Helpers for crash tests: arm a service with SAGA_FAULTS, wait for its kill -9, restart it, watch sagas."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

import asyncpg

from saga_orchestrator.cli.demo_cmd import publish_starts
from saga_orchestrator.client.event_feed import EventFeed
from saga_orchestrator.infra.faults import ENV_VAR
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import VerifyReport
from saga_orchestrator.participants.trip.effects import collect_effects
from saga_orchestrator.participants.trip.scenarios import SCENARIOS, observed
from saga_orchestrator.schemas.event_types import Event
from saga_orchestrator.schemas.topics import Topics
from tests.e2e.harness import Stack, start_stack

DISARMED = {ENV_VAR: ""}  # a restarted service must not inherit a crash point from anywhere

# Trip scenarios whose outcome does not depend on timing (a cancel races the saga, so "cancelled" is out).
CRASH_MIX: Mapping[str, int] = {"happy": 4, "card_slow": 1, "card_flaky": 2, "atlantis": 1, "invalid_route": 1,
                                "card_declined": 1, "email_bounce": 1, "uncancellable": 1}

# What each service logs once it works: consumers joined their groups, and the orchestrator's in-process relay
# (``saga run all``) holds its table's lock.
READY_LINES: Mapping[str, tuple[str, ...]] = {"orchestrator": ("orchestrator consumer started", "outbox relay active")}
PARTICIPANT_READY = ("participant started",)


def plan(run_id: str, mix: Mapping[str, int]) -> dict[str, str]:
    """Saga id → scenario name, ``mix[name]`` sagas of each scenario."""
    return {f"{run_id}-{name}-{i}": name for name, count in mix.items() for i in range(1, count + 1)}


def armed(point: str, nth: int) -> dict[str, str]:
    """The environment that kills a service the ``nth`` time it reaches ``point``."""
    return {ENV_VAR: f"{point}={nth}"}


async def logged_within(stack: Stack, label: str, text: str, within_s: float, since: int = 0) -> bool:
    """Whether service ``label`` logs ``text`` (after log offset ``since``) within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while text not in stack.log(label)[since:]:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def wait_until_ready(stack: Stack, labels: Iterable[str], timeout_s: float = 90,
                           since: Mapping[str, int] | None = None) -> None:
    """Wait until each service logged that it is ready (after log offset ``since[label]`` when given)."""
    deadline = time.monotonic() + timeout_s
    offsets = since or {}
    waiting = [label for label in labels if not await _ready(stack, label, deadline, offsets.get(label, 0))]
    if waiting:
        tails = "\n".join(f"{label}: {stack.log(label)[-1500:]}" for label in sorted(waiting))
        raise RuntimeError(f"not ready after {timeout_s} s: {sorted(waiting)}\n{tails}")


async def _ready(stack: Stack, label: str, deadline: float, since: int) -> bool:
    """Whether service ``label`` logs each of its ready lines (after log offset ``since``) before ``deadline``."""
    for line in READY_LINES.get(label, PARTICIPANT_READY):
        if not await logged_within(stack, label, line, max(0.0, deadline - time.monotonic()), since):
            return False
    return True


async def restart(stack: Stack, label: str, extra_env: dict[str, str] | None = None) -> None:
    """Stop one service gracefully (it leaves its consumer group at once), start it again, wait until ready."""
    process = stack.processes[label]
    if process.poll() is None:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    offset = len(stack.log(label))
    stack.start(label, extra_env=extra_env or DISARMED)
    await wait_until_ready(stack, [label], since={label: offset})


async def ensure_running(stack: Stack) -> None:
    """Start every service that is not running and wait until those are ready."""
    down = [label for label in stack.labels
            if label not in stack.processes or stack.processes[label].poll() is not None]
    offsets = {label: len(stack.log(label)) for label in down}
    for label in down:
        stack.start(label, extra_env=DISARMED)
    await wait_until_ready(stack, down, since=offsets)


async def wait_for_exit(stack: Stack, label: str, timeout_s: float) -> int | None:
    """The exit code of ``label`` once it exited, or None when it still runs after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = stack.processes[label].poll()
        if code is not None:
            return code
        await asyncio.sleep(0.05)
    return None


def killed_by_its_crash_point(stack: Stack, label: str, point: str, code: int | None) -> str | None:
    """None when ``label`` died of SIGKILL at ``point``, else what happened instead."""
    if code != -signal.SIGKILL:
        return f"{label} exit code {code}, expected -9; log tail:\n{stack.log(label)[-3000:]}"
    if f"kill -9 at crash point {point}" not in stack.log(label):
        return f"{label} was killed, but not by crash point {point}"
    return None


class SagaWatch:
    """Publishes trip sagas and follows saga.events until they end."""

    def __init__(self, stack: Stack) -> None:
        self.settings = stack.settings
        self.feed = EventFeed(self.settings.kafka(), Topics(self.settings.saga_topic_prefix).events)

    async def __aenter__(self) -> SagaWatch:
        await self.feed.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.feed.stop()

    async def start(self, planned: Mapping[str, str]) -> None:
        """Publish one StartSaga per planned saga."""
        await publish_starts(self.settings, dict(planned))

    async def wait_for(self, saga_id: str, event_type: str, timeout_s: float, step: str | None = None) -> Event:
        """The first event of that type (and step) of the saga on saga.events; fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in self.feed.history(saga_id):
                if type(event).__name__ == event_type and (step is None or getattr(event, "step", None) == step):
                    return event
            await self.feed.poll(50)
        raise AssertionError(f"no {event_type} {step or ''} of {saga_id} within {timeout_s} s: "
                             f"{[type(e).__name__ for e in self.feed.history(saga_id)]}")

    async def ended(self, saga_ids: Iterable[str], timeout_s: float) -> dict[str, str]:
        """Saga id → terminal event name, for those that ended within ``timeout_s``."""
        found = await self.feed.wait_terminal(saga_ids, timeout_s)
        return {saga_id: type(event).__name__ for saga_id, event in found.items()}


async def started_and_ready(settings: Settings, log_dir: Path) -> Stack:
    """Start every service and wait until each says it is ready."""
    stack = await start_stack(settings, log_dir)
    try:
        await wait_until_ready(stack, stack.labels)
    except BaseException:
        stack.stop()
        raise
    return stack


async def started_and_warm(settings: Settings, log_dir: Path) -> Stack:
    """Start every service, wait until each is ready, then run one happy saga through them (a participant
    still starting would time the first steps out and change how the sagas of a test end)."""
    stack = await start_stack(settings, log_dir)
    try:
        await wait_until_ready(stack, stack.labels)
        saga_id = f"warm-up-{uuid.uuid4().hex[:6]}"
        async with SagaWatch(stack) as watch:
            await watch.start({saga_id: "happy"})
            ended = await watch.ended([saga_id], 60)
        if ended.get(saga_id) != "SagaCompleted":
            raise RuntimeError(f"the warm-up saga did not complete: {ended}; logs in {log_dir}")
    except BaseException:
        stack.stop()
        raise
    return stack


async def scenario_problems(pool: asyncpg.Pool, planned: Mapping[str, str],
                            ended: Mapping[str, str]) -> dict[str, list[str]]:
    """``saga id (scenario)`` → how the saga differs from its scenario: the terminal event it ended with,
    then the participants' effects; sagas that match are left out."""
    wrong = {}
    for saga_id, name in planned.items():
        problems = SCENARIOS[name].problems(ended.get(saga_id), observed(await collect_effects(pool, saga_id)))
        if problems:
            wrong[f"{saga_id} ({name})"] = problems
    return wrong


def unexpected_endings(planned: Mapping[str, str], ended: Mapping[str, str]) -> list[str]:
    """Sagas that did not end with a terminal event their scenario allows."""
    return [f"{saga_id} ({name}) ended {ended.get(saga_id, 'not at all')}, expected {SCENARIOS[name].terminal}"
            for saga_id, name in sorted(planned.items()) if ended.get(saga_id) not in SCENARIOS[name].may_end_as()]


def describe(report: VerifyReport) -> str:
    """A readable report for an assertion message."""
    lines = [f"started {report.started}, terminal {report.terminal}"]
    lines += [f"not terminal: {saga_id} {status}: {why}" for saga_id, status, why in report.not_terminal[:20]]
    lines += [f"violation: {v.saga_id}: {v.problem}" for v in report.violations[:40]]
    return "\n".join(lines)
