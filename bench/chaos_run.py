"""The chaos engine behind ``bench/chaos.py`` and ``tests/chaos/test_chaos_soak.py``.

Against a running stack (every service a child process, on a Kafka and a Postgres this run may restart) it
starts trip sagas of every scenario at a steady rate while, at random (seeded) moments, it kill -9s a
service and restarts it, restarts the broker, restarts Postgres and injects duplicate messages. Then it
stops the chaos, waits for every started saga to end, and checks every invariant with ``verify_system``.

A saga counts as started once Kafka acknowledged its StartSaga (publishing is retried through outages with
the same message id, so a retry is a duplicate the orchestrator drops). Lost = started, not terminal after
the drain timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.chaos_support import Publisher, poll_until, schedule, sleep_or_over
from saga_orchestrator.client.event_feed import EventFeed
from saga_orchestrator.infra import launcher
from saga_orchestrator.infra.isolation import BELOW_THE_BATCH
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import VerifyReport, verify_system
from saga_orchestrator.participants.registry import participant_workers
from saga_orchestrator.participants.runner import hosted_participants
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaCancelRefused, SagaStarted
from saga_orchestrator.schemas.message_types import CancelSaga
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.tools.duplicator import Duplicator
from tests.e2e.harness import Stack

log = logging.getLogger("saga.chaos")

Note = Callable[[str], None]
Fault = tuple[float, str, Callable[[], Awaitable[None]]]
"""A fault of the caller's own: seconds after the start, its name, and the coroutine that brings it about (and
ends it)."""


@dataclass(frozen=True)
class ChaosPlan:
    """How much of what, for how long; every random choice comes from ``seed``."""

    duration_s: float = 600.0
    rate: float = 4.0  # sagas started per second
    kill_every_s: float = 15.0  # mean time between two service kills (0: no kills)
    broker_restart_every_s: float = 240.0  # 0: no broker restarts
    db_restart_every_s: float = 240.0  # 0: no Postgres restarts
    outage_s: tuple[float, float] = (0.0, 4.0)  # how long the broker / Postgres stays down per restart
    restart_after_s: tuple[float, float] = (0.3, 3.0)  # a killed service comes back after this long
    duplicates: bool = True
    duplicate_copies: int = 1  # extra copies of every start, cancel, command and reply while duplicating
    seed: int = 1
    drain_timeout_s: float = 240.0
    scenarios: tuple[str, ...] = tuple(SCENARIOS)


@dataclass
class ChaosResult:
    """What happened and what ``verify_system`` found afterwards."""

    plan: ChaosPlan
    scenario_of: dict[str, str] = field(default_factory=dict)  # every saga whose StartSaga was acknowledged
    outcome_of: dict[str, str] = field(default_factory=dict)  # terminal event seen on saga.events
    cancel_refused: set[str] = field(default_factory=set)  # sagas whose CancelSaga came after the pivot began
    kills: Counter[str] = field(default_factory=Counter)
    unexpected_exits: Counter[str] = field(default_factory=Counter)  # services that died on their own
    broker_restarts: int = 0
    db_restarts: int = 0
    faults: list[str] = field(default_factory=list)  # the caller's own faults, as they ended
    duplicates_injected: int = 0
    chaos_s: float = 0.0
    drain_s: float = 0.0
    terminal_during_chaos: int = 0
    report: VerifyReport | None = None
    # "service: what the ladder logged (ladder or component): error" → times, from the services' logs of this run.
    # The chaos holds no poison, so every one is a finding: healthy work sent down a ladder.
    isolation_steps: Counter[str] = field(default_factory=Counter)

    @property
    def lost(self) -> list[tuple[str, str, str]]:
        """Started sagas that did not end within the drain timeout (saga id, state, where it waits)."""
        return self.report.not_terminal if self.report else [(s, "?", "not verified") for s in self.scenario_of]

    def may_end_as(self, saga_id: str) -> set[str]:
        """The terminal events ``saga_id`` may end with, by its scenario and whether its cancel was refused."""
        return SCENARIOS[self.scenario_of[saga_id]].may_end_as(saga_id in self.cancel_refused)

    @property
    def ended_otherwise(self) -> dict[str, tuple[str, str | None]]:
        """Saga id → (scenario, terminal event seen) for every saga that did not end as it must."""
        return {saga_id: (name, self.outcome_of.get(saga_id)) for saga_id, name in self.scenario_of.items()
                if self.outcome_of.get(saga_id) not in self.may_end_as(saga_id)}

    @property
    def ok(self) -> bool:
        """Nothing lost, no invariant broken."""
        return self.report is not None and not self.lost and not self.report.violations


class ChaosRun:
    """One chaos run over ``stack``; ``servers`` (default: the stack's settings) are the launcher settings of
    the Kafka and Postgres it runs on, which this run owns and may restart."""

    def __init__(self, stack: Stack, plan: ChaosPlan, note: Note | None = None,
                 servers: Settings | None = None, faults: Sequence[Fault] = ()) -> None:
        self.stack = stack
        self.settings: Settings = stack.settings
        self.servers = servers or stack.settings
        self.plan = plan
        self.topics = Topics(self.settings.saga_topic_prefix)
        self.result = ChaosResult(plan)
        self._rng = random.Random(plan.seed)
        self._note = note or (lambda text: log.info(text))
        self._publisher = Publisher(self.settings.kafka())
        self._down: set[str] = set()  # services killed by us and not restarted yet
        self._pending: set[asyncio.Task[None]] = set()
        self._to_cancel: set[str] = set()
        self._feed = EventFeed(self.settings.kafka(), self.topics.events)
        self._run_id = uuid.uuid4().hex[:6]
        self._faults = list(faults)

    # -- the run -----------------------------------------------------------------------------------------

    async def run(self) -> ChaosResult:
        """Chaos for ``duration_s``, then drain and verify; returns the result (never raises for a finding)."""
        plan = self.plan
        await self._feed.start()
        chaos_over = asyncio.Event()
        started = time.monotonic()
        tasks = [asyncio.create_task(job, name=name) for name, job in (
            ("load", self._load(chaos_over)), ("killer", self._killer(chaos_over)),
            ("watchdog", self._watchdog(chaos_over)), ("feed", self._follow(chaos_over)),
            ("broker", self._restarts("broker", plan.broker_restart_every_s, 0.3, chaos_over)),
            ("postgres", self._restarts("postgres", plan.db_restart_every_s, 0.7, chaos_over)),
            ("faults", self._own_faults(started)),
        )]
        logged_before = {label: len(self.stack.log(label)) for label in self.stack.labels}
        dup_stop = asyncio.Event()
        if plan.duplicates:
            tasks.append(asyncio.create_task(self._duplicate(dup_stop), name="duplicator"))
        try:
            await asyncio.sleep(plan.duration_s)
            chaos_over.set()
            self.result.chaos_s = time.monotonic() - started
            self.result.terminal_during_chaos = len(self.result.outcome_of)
            dup_stop.set()
            # Everything but the event feed, which keeps following while the sagas drain.
            await asyncio.gather(*(task for task in tasks if task.get_name() != "feed"))
            await self._all_up()
            self._note("chaos over: every service and both servers running again; draining")
            await self._drain()
        finally:
            chaos_over.set()
            dup_stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, *self._pending, return_exceptions=True)
            await self._feed.stop()
            await self._publisher.close()
            self.result.isolation_steps = isolation_steps(self.stack, logged_before)
        return self.result

    async def _drain(self) -> None:
        drain_started = time.monotonic()
        deadline = drain_started + self.plan.drain_timeout_s
        await poll_until(lambda: not self._pending, deadline)  # StartSagas still being (re)published
        await poll_until(lambda: self.result.scenario_of.keys() <= self.result.outcome_of.keys(), deadline)
        # verify_system waits for what the events topic has not shown yet (at least a little, for summaries).
        remaining = max(10.0, deadline - time.monotonic())
        self.result.report = await verify_system(self.settings, list(self.result.scenario_of), wait_s=remaining)
        self.result.drain_s = time.monotonic() - drain_started

    # -- load --------------------------------------------------------------------------------------------

    async def _load(self, over: asyncio.Event) -> None:
        interval = 1.0 / self.plan.rate
        next_at = time.monotonic()
        number = 0
        while not over.is_set():
            number += 1
            scenario = self._rng.choice(self.plan.scenarios)
            saga_id = f"chaos-{self._run_id}-{number:05d}-{scenario}"
            self._spawn(self._publish_start(saga_id, scenario))
            next_at += interval
            await sleep_or_over(next_at - time.monotonic(), over)

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(job)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish_start(self, saga_id: str, scenario: str) -> None:
        body = wire.encode_start(SCENARIOS[scenario].start(saga_id))
        await self._publisher.publish(self.topics.start, saga_id, body, f"{saga_id}:start")
        self.result.scenario_of[saga_id] = scenario
        if SCENARIOS[scenario].cancel:
            self._to_cancel.add(saga_id)

    async def _follow(self, over: asyncio.Event) -> None:
        """Read saga.events: record outcomes, cancel the 'cancelled' scenario's sagas once they started."""
        while True:
            try:
                events = await self._feed.poll(200)
            except Exception as error:  # the feed reconnects by itself; a failed poll is just retried
                log.debug("event feed poll failed", extra={"error": repr(error)})
                await asyncio.sleep(0.5)
                continue
            for event in events:
                if isinstance(event, SagaStarted) and event.saga_id in self._to_cancel:
                    self._to_cancel.discard(event.saga_id)
                    body = wire.encode_cancel(CancelSaga(saga_id=event.saga_id, reason="customer changed plans"))
                    self._spawn(self._publisher.publish(self.topics.control, event.saga_id, body,
                                                        f"{event.saga_id}:cancel"))
                elif isinstance(event, SagaCancelRefused) and event.saga_id in self.result.scenario_of:
                    self.result.cancel_refused.add(event.saga_id)
            for saga_id, terminal in self._feed.terminal.items():
                self.result.outcome_of.setdefault(saga_id, type(terminal).__name__)

    # -- chaos -------------------------------------------------------------------------------------------

    async def _killer(self, over: asyncio.Event) -> None:
        mean = self.plan.kill_every_s
        if mean <= 0:
            return
        while not over.is_set():
            if await sleep_or_over(self._rng.uniform(0.5 * mean, 1.5 * mean), over):
                return
            candidates = [label for label in self.stack.labels if label not in self._down]
            if not candidates:
                continue
            fewest = min(self.result.kills[label] for label in candidates)
            target = self._rng.choice([label for label in candidates if self.result.kills[label] == fewest])
            self._down.add(target)
            self.stack.kill(target)
            self.result.kills[target] += 1
            self._note(f"kill -9 {target} (kill {sum(self.result.kills.values())})")
            self._spawn(self._restart_later(target, self._rng.uniform(*self.plan.restart_after_s)))

    async def _restart_later(self, label: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self.stack.start(label)
        self._down.discard(label)

    async def _watchdog(self, over: asyncio.Event) -> None:
        """A service that exits without being killed is a finding: count it and start it again."""
        while not await sleep_or_over(1.0, over):
            self._restart_exited()
        self._restart_exited()

    def _restart_exited(self) -> None:
        for label, code in self.stack.exited().items():
            if label not in self._down:
                self.result.unexpected_exits[label] += 1
                self._note(f"[red]{label} exited by itself (code {code}); restarting it[/]")
                self.stack.start(label)

    async def _restarts(self, server: str, every_s: float, phase: float, over: asyncio.Event) -> None:
        started = time.monotonic()
        for at in schedule(self._rng, self.plan.duration_s, every_s, phase):
            if await sleep_or_over(started + at - time.monotonic(), over):
                return
            outage = self._rng.uniform(*self.plan.outage_s)
            self._note(f"restart {server} (down for {outage:.1f} s plus its stop and start)")
            if server == "broker":
                await launcher.stop_kafka(self.servers)
                await asyncio.sleep(outage)
                await launcher.start_kafka(self.servers)
                self.result.broker_restarts += 1
            else:
                await launcher.stop_postgres(self.servers)
                await asyncio.sleep(outage)
                await launcher.start_postgres(self.servers)
                self.result.db_restarts += 1

    async def _own_faults(self, started: float) -> None:
        for at, name, fault in sorted(self._faults, key=lambda planned: planned[0]):
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            self._note(f"fault: {name}")
            await fault()
            self.result.faults.append(name)

    async def _all_up(self) -> None:
        await launcher.start_kafka(self.servers)  # no-ops when running
        await launcher.start_postgres(self.servers)
        await poll_until(lambda: not self._down, time.monotonic() + 30)
        self._restart_exited()

    async def _duplicate(self, stop: asyncio.Event) -> None:
        """Inject duplicates until ``stop``; a duplicator that fails (the broker restarting under it) is
        replaced by a new one, which carries on from the topics' end."""
        while not stop.is_set():
            injector = self._duplicator()
            try:
                await injector.run(stop)
            except Exception as error:
                log.debug("duplicator failed, starting another", extra={"error": repr(error)})
                await sleep_or_over(1.0, stop)
            finally:
                self.result.duplicates_injected += injector.injected

    def _duplicator(self) -> Duplicator:
        participants = [participant.name for worker in participant_workers(self.settings)
                        for participant in hosted_participants(worker)]
        topics = [self.topics.start, self.topics.control]
        topics += [name for p in participants for name in (self.topics.commands(p), self.topics.results(p))]
        return Duplicator(self.settings, topics, copies=self.plan.duplicate_copies, shuffle_window=50,
                          seed=self._rng.randrange(2**32))


def isolation_steps(stack: Stack, logged_before: dict[str, int] | None = None) -> Counter[str]:
    """What the services logged of ``infra.isolation.BELOW_THE_BATCH`` (after ``logged_before``: characters of
    each log to skip), counted as "service: message (ladder or component): error"."""
    steps: Counter[str] = Counter()
    for label in stack.labels:
        for line in stack.log(label)[(logged_before or {}).get(label, 0):].splitlines():
            if not any(message in line for message in BELOW_THE_BATCH):
                continue
            try:
                record = json.loads(line)
            except ValueError:  # a line of another format: counted as it stands
                steps[f"{label}: {line[:200]}"] += 1
                continue
            where = record.get("ladder") or record.get("component")
            steps[f"{label}: {record.get('msg')} ({where}): {str(record.get('error', ''))[:120]}"] += 1
    return steps
