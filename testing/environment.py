"""Run sagas in-process, in milliseconds: the real pipeline, a memory store, scripted participants, virtual time.

    env = SagaEnvironment(checkout)                              # a Saga, a SagaDefinition or a SagaApp
    env.script(create_shipment, fail("Undeliverable"))           # by the action object, or ("shipping", "ship")
    saga_id = await env.start(checkout, Order(...))
    result = await env.result(saga_id)                           # runs virtual time until the saga ends
    assert result.status == "COMPENSATED" and result.compensated == ["authorize_payment", "reserve_stock"]

Every message goes through the orchestrator's own ``SagaService`` (the inbox, ``fold``, ``decide``, the
writes, durable timers) on a ``MemoryStore``; commands go to participants that answer as they are scripted
(``saga_orchestrator.testing.behaviour``; unscripted actions succeed), keeping a record by idempotency key as
the kit does. Time is virtual: ``advance`` moves it and fires what comes due on the way, ``result`` moves it
from one due timer or late answer to the next until the saga ends, so a 48-hour deadline takes milliseconds.
"""

from __future__ import annotations

import heapq
import itertools
import json
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..authoring import Saga, SagaApp, SignalRef, StepRef
from ..operations import bulk_jobs
from ..operations.bulk_jobs import BulkJob, Count, Selection
from ..operations.reads import Reads
from ..orchestrator.domain.definition import DefinitionRegistry, SagaDefinition
from ..orchestrator.domain.state import SagaState, fold
from ..orchestrator.inbound import RecordParser
from ..orchestrator.service import SagaService
from ..orchestrator.store.memory import MemoryStore
from ..orchestrator.store.operations.bulk_jobs import MemoryBulkJobs
from ..orchestrator.store.operations.reads import MemoryReads
from ..participants.kit.typed import Action
from ..schemas import event_types as ev
from ..schemas import wire
from ..schemas.headers import MESSAGE_ID
from ..schemas.ids import forward_key
from ..schemas.message_types import (
    ACTION_RULES,
    CANCEL,
    RELEASE,
    RESUME,
    SAGA_ACTIONS,
    CommandKind,
    ControlCommand,
    DeadLetter,
    Lever,
    OperateSaga,
    ResultStatus,
    SignalSaga,
    StartSaga,
    StepCommand,
    StepResult,
    WithdrawStep,
    action_name,
    lever_command,
)
from ..schemas.records import ConsumedRecord
from ..schemas.registry import SchemaRegistry, default_registry, load_tree
from ..schemas.topics import Topics
from ..schemas.typed import Record, from_avro, schema_files, to_avro
from .behaviour import Behaviour, Response, succeed

__all__ = ["SagaEnvironment", "SagaResult", "SagaWaits"]

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: the virtual clock's start, unless given
Deployment = Saga | SagaDefinition | SagaApp


class SagaWaits(AssertionError):
    """A saga that is not over and waits for nothing that will come (or not within the time given)."""


@dataclass(frozen=True)
class SagaResult:
    """How a saga ended in the environment, and what happened on the way."""

    saga_id: str
    status: str  # COMPLETED, COMPENSATED, FAILED, COMPENSATION_FAILED, CANCELLED, ...
    events: list[ev.Event]
    commands: list[StepCommand]  # every command sent for it, in order (retries and compensations included)
    effects: Mapping[str, tuple[int, int]]  # step -> (times it took effect, times it was undone)
    elapsed: timedelta  # virtual time from the start to the end
    outputs: Mapping[str, BaseModel | bytes] = field(default_factory=dict)  # by step, decoded when typed
    definition: SagaDefinition | None = None  # the saga's own: what names its steps
    withdrawn: list[WithdrawStep] = field(default_factory=list)  # every withdrawal sent for it, in order

    @property
    def compensated(self) -> list[str]:
        """The steps undone, in the order their compensations succeeded."""
        return [event.step for event in self.events if isinstance(event, ev.StepCompensated)]

    @property
    def succeeded(self) -> list[str]:
        """The steps that succeeded, in the order they did."""
        return [event.step for event in self.events if isinstance(event, ev.StepSucceeded)]

    @property
    def event_types(self) -> list[str]:
        return [type(event).__name__ for event in self.events]

    def attempts(self, step: str | StepRef | Action) -> int:
        """Forward commands sent for ``step`` (its attempts): a step's name, its reference (what ``Saga.step``
        returned) or the action it runs; ValueError for one the saga has not, naming the steps it has."""
        name = self.step_name(step)
        return sum(1 for command in self.commands if command.step == name and command.kind is CommandKind.FORWARD)

    def step_name(self, step: str | StepRef | Action) -> str:
        """The name of the saga's step ``step`` names (a name, a step reference or the action it runs)."""
        if isinstance(step, StepRef):
            name = step.name
        elif isinstance(step, Action):
            if self.definition is None:
                raise ValueError("an action names a step only for a saga whose definition the result holds")
            names = [s.name for s in self.definition.steps
                     if (s.participant, s.command) == (step.participant_name, step.name)]
            if len(names) != 1:
                raise ValueError(f"action {step.participant_name}.{step.name} is the command of "
                                 f"{'no step' if not names else 'several steps'} of saga {self.saga_id} "
                                 f"({', '.join(names) or ', '.join(self.definition.order)}): name the step")
            name = names[0]
        else:
            name = step
        if self.definition is not None and not self.definition.has_step(name):
            steps = ", ".join(self.definition.order)
            raise ValueError(f"saga {self.saga_id} has no step {name!r} (its steps: {steps})")
        return name


class SagaEnvironment:
    """Sagas of a deployment run in-process (see the module); ``now`` is the virtual clock in epoch ms."""

    def __init__(self, *deployment: Deployment, start_ms: int = START_MS, duplicate_messages: bool = False) -> None:
        self.now = start_ms
        self._sagas = _definitions(deployment)
        self._records = _records(deployment)
        self._outputs = _outputs(deployment)
        self.definitions = DefinitionRegistry(self._sagas)
        self.topics = Topics()
        self.schemas = _schemas(self._records)
        self.store = MemoryStore(clock_ms=lambda: self.now)
        self.bulk_store = MemoryBulkJobs(self.store)  # bulk jobs over the same read model and outbox
        self.service = SagaService(self.store, self.definitions, self.topics, lambda: self.now, schemas=self.schemas)
        participants = sorted({step.participant for definition in self._sagas for step in definition.steps
                               if not step.waits})
        self._parser = RecordParser(self.topics, self.definitions, self.schemas, tuple(participants))
        self._commands = {self.topics.commands(name): name for name in participants}
        self._scripts: dict[tuple[str, str], Behaviour] = {}
        self._recorded: dict[str, Response] = {}  # idempotency key -> the outcome recorded for it
        self._recorded_attempt: dict[str, int] = {}  # idempotency key -> the attempt that recorded it
        self._tombstones: dict[str, str] = {}  # fenced forward keys: the error type a later delivery is answered
        self._down: set[str] = set()  # participants stopped: their commands wait, picked up when they start
        self._held: dict[str, list[StepCommand | WithdrawStep]] = {}  # a stopped participant's commands, in order
        self._awaiting: dict[str, tuple[StepCommand, Response | None]] = {}  # deferred: key -> command, answer
        self._later: list[tuple[int, int, str, str]] = []  # (due, order, key, "answer" | "expire") of deferrals
        self._queue: list[tuple[int, int, ConsumedRecord]] = []
        self._order = itertools.count()
        self._offsets: Counter[str] = Counter()
        self._duplicate = duplicate_messages
        self._effects: Counter[tuple[str, str, CommandKind]] = Counter()
        self._started_at: dict[str, int] = {}
        self.sent: list[StepCommand] = []
        self.withdrawn: list[WithdrawStep] = []
        self.letters: list[DeadLetter] = []

    @property
    def reads(self) -> Reads:
        """The operator's reads (what the console and ``saga list`` show) over this environment's store."""
        return Reads(MemoryReads(self.store), self.definitions, self.schemas)

    # -- scripting ---------------------------------------------------------------------------------------------

    def script(self, action: Action | tuple[str, str], behaviour: Behaviour) -> None:
        """How ``action`` (a typed action, or ``(participant, action)``) answers from now on; ValueError when no
        step of the environment's sagas sends it (a misspelt name would otherwise script nothing)."""
        key = (action.participant_name, action.name) if isinstance(action, Action) else action
        sent = {(step.participant, name) for definition in self._sagas for step in definition.steps
                if not step.waits for name in (step.command, step.compensation) if name is not None}
        if key not in sent:
            known = ", ".join(f"{participant}.{name}" for participant, name in sorted(sent))
            raise ValueError(f"no step of the environment's sagas sends {key[0]}.{key[1]} (they send: {known})")
        self._scripts[key] = behaviour

    # -- what a client does ------------------------------------------------------------------------------------

    async def start(self, saga: Saga | SagaDefinition | str, saga_input: BaseModel | Mapping[str, Any], *,
                    saga_id: str | None = None, tenant_id: str | None = None, version: int | None = None) -> str:
        """Start a saga of that type with ``saga_input`` (its input model, or a plain mapping) and let it run as
        far as it goes without time passing; its id. ``version``: the definition version it asks to start on (None:
        the latest that takes starts); the orchestrator refuses one not deployed or draining (SagaRejected)."""
        saga_type = saga if isinstance(saga, str) else saga.saga_type
        saga_id = saga_id or f"{saga_type}-{len(self._started_at) + 1}"
        start = self._start_message(saga, saga_input, saga_id, tenant_id, version)
        self._started_at.setdefault(saga_id, self.now)
        self._send(self.topics.start, saga_id, wire.encode_start(start), f"{saga_id}:start:{next(self._order)}")
        await self._settle()
        return saga_id

    def _start_message(self, saga: Saga | SagaDefinition | str, saga_input: BaseModel | Mapping[str, Any],
                       saga_id: str, tenant_id: str | None, version: int | None = None) -> StartSaga:
        saga_type = saga if isinstance(saga, str) else saga.saga_type
        # The input fits the version it names when that one is deployed; one that is not is the orchestrator's to
        # refuse, so it is sent all the same.
        named = [d for d in self.definitions.definitions() if (d.saga_type, d.version) == (saga_type, version)]
        definition = named[0] if named else self.definitions.latest(saga_type)
        if definition is None:
            known = ", ".join(self.definitions.types())
            raise KeyError(f"unknown saga type {saga_type!r}; the environment runs {known}")
        record = to_avro(saga_input) if isinstance(saga_input, BaseModel) else dict(saga_input)
        return StartSaga(saga_id=saga_id, saga_type=saga_type, tenant_id=tenant_id,
                         input=self.schemas.encode(definition.input_schema, record), definition_version=version)

    async def signal(self, saga_id: str, signal: str | SignalRef, payload: BaseModel | Mapping[str, Any], *,
                     signal_id: str | None = None, sender: str | None = "test",
                     start: tuple[Saga | SagaDefinition | str, BaseModel | Mapping[str, Any]] | None = None) -> str:
        """Send a SignalSaga (``signal``: its name or the saga type's ``SignalRef``; ``payload``: its model, or a
        plain mapping) and let the saga run on; with ``start`` (saga type, input) it starts the saga first when
        there is none. Sent twice with one ``signal_id``, the second changes nothing. The signal's id."""
        name = signal.name if isinstance(signal, SignalRef) else signal
        records = {record for definition in self._sagas for declared, record in definition.signals if declared == name}
        if len(records) != 1:
            known = sorted({declared for definition in self._sagas for declared, _ in definition.signals})
            raise ValueError(f"no single signal {name!r} among the environment's sagas (they take: "
                             f"{', '.join(known) or 'none'})")
        record = to_avro(payload) if isinstance(payload, BaseModel) else dict(payload)
        signal_id = signal_id or f"{saga_id}:signal:{next(self._order)}"
        starts: StartSaga | None = None
        if start is not None:
            starts = self._start_message(start[0], start[1], saga_id, None)
            self._started_at.setdefault(saga_id, self.now)
        message = SignalSaga(saga_id=saga_id, signal_id=signal_id, signal=name,
                             payload=self.schemas.encode(records.pop(), record), sender=sender,
                             start_saga_type=None if starts is None else starts.saga_type,
                             start_input=None if starts is None else starts.input)
        self._send(self.topics.control, saga_id, wire.encode_signal(message), f"{saga_id}:signal:{next(self._order)}")
        await self._settle()
        return signal_id

    async def pull(self, action: str, saga_id: str, step: str | None = None, reason: str | None = None) -> None:
        """Send an operator's ``action`` (any of ``SAGA_ACTIONS``, as test's) and let the saga run on; LeverRefused
        when it is asked wrongly (``lever_command``, as every face)."""
        await self.control(lever_command(action, saga_id, step, "test", reason))

    async def cancel(self, saga_id: str, reason: str = "cancelled in a test") -> None:
        await self.pull(CANCEL, saga_id, None, reason)

    async def resume(self, saga_id: str) -> None:
        await self.pull(RESUME, saga_id)

    async def release(self, saga_id: str) -> None:
        await self.pull(RELEASE, saga_id)

    async def retry_now(self, saga_id: str, step: str, reason: str | None = None) -> None:
        await self.pull(Lever.RETRY_NOW, saga_id, step, reason)

    async def skip(self, saga_id: str, step: str, reason: str) -> None:
        await self.pull(Lever.SKIP, saga_id, step, reason)

    async def force_compensate(self, saga_id: str, reason: str) -> None:
        await self.pull(Lever.FORCE_COMPENSATE, saga_id, None, reason)

    async def terminate(self, saga_id: str, reason: str) -> None:
        await self.pull(Lever.TERMINATE, saga_id, None, reason)

    async def pause(self, saga_id: str) -> None:
        await self.pull(Lever.PAUSE, saga_id)

    async def unpause(self, saga_id: str) -> None:
        await self.pull(Lever.UNPAUSE, saga_id)

    async def redrive(self, saga_id: str, reason: str) -> None:
        await self.pull(Lever.REDRIVE, saga_id, None, reason)

    async def control(self, message: ControlCommand) -> None:
        """Send any saga.control command as it is (a lever the table would refuse too: the core's refusal is
        what such a test is after)."""
        self._send(self.topics.control, message.saga_id, wire.encode_control(message),
                   f"{message.saga_id}:control:{next(self._order)}")
        await self._settle()

    async def operate(self, message: OperateSaga) -> None:
        """Send an operator's lever as it is (``control``)."""
        await self.control(message)

    # -- bulk jobs ---------------------------------------------------------------------------------------------

    async def bulk_count(self, selection: Selection) -> Count:
        """The dry run of a bulk job: how many of the environment's sagas ``selection`` matches now."""
        return await bulk_jobs.count(self.bulk_store, selection, self.definitions)

    async def bulk_run(self, selection: Selection, action: str, reason: str, *, step: str | None = None,
                       rate_per_s: float = bulk_jobs.DEFAULT_RATE_PER_S,
                       definition_version: int | None = None) -> BulkJob:
        """Start a bulk job (operator "test") and run it to its end as the orchestrator's runner would, batch by
        batch at ``rate_per_s`` on the virtual clock, each saga taking its command; the job as it ended.
        ``definition_version``: the version a Migrate moves the sagas to. BulkJobError when it cannot start
        (nothing matches, an action asked wrongly)."""
        job = await bulk_jobs.start(self.bulk_store, selection, self.definitions, action=action, operator="test",
                                    reason=reason, step=step, rate_per_s=rate_per_s,
                                    definition_version=definition_version)
        runner = bulk_jobs.BulkRunner(self.bulk_store, self.definitions, self.topics)
        while (ran := await self.bulk_store.job(job.id)) is not None and ran.status == "RUNNING":
            if await runner.run_batch() is not None:
                self._drain()
                await self._settle()
            else:
                await self.advance(seconds=max(bulk_jobs.MIN_WAIT_S, await self.bulk_store.seconds_to_next() or 0))
        assert ran is not None
        return ran

    # -- participants ------------------------------------------------------------------------------------------

    def stop(self, participant: str) -> None:
        """No worker of ``participant`` runs from now on: its commands wait on their topic until ``start``."""
        self._down.add(participant)
        self._held.setdefault(participant, [])

    async def start_participant(self, participant: str) -> None:
        """A worker of ``participant`` runs again: it picks up what waited, in order and as one batch (a forward
        command withdrawn later in it does not run; one whose attempt expired meanwhile is answered Expired)."""
        self._down.discard(participant)
        held = self._held.pop(participant, [])
        self._deliver(held)
        await self._settle()

    def awaiting(self, saga_id: str | None = None) -> list[str]:
        """The idempotency keys of deferred commands whose answer is outstanding (of one saga, when given)."""
        return sorted(key for key, (command, _) in self._awaiting.items()
                      if saga_id is None or command.saga_id == saga_id)

    # -- time --------------------------------------------------------------------------------------------------

    async def advance(self, duration: timedelta | None = None, *, days: float = 0, hours: float = 0,
                      minutes: float = 0, seconds: float = 0, milliseconds: float = 0) -> None:
        """Move the virtual clock on, firing every timer and delivering every late answer that comes due on the
        way, in order."""
        step = duration or timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds,
                                     milliseconds=milliseconds)
        target = self.now + round(step.total_seconds() * 1000)
        await self._settle()
        while (next_at := await self._next_at()) is not None and next_at <= target:
            self.now = max(self.now, next_at)
            await self._settle()
        self.now = target
        await self._settle()

    async def result(self, saga_id: str, within: timedelta = timedelta(days=30)) -> SagaResult:
        """Run virtual time until ``saga_id`` ended (at most ``within``); how it ended. SagaWaits when it does
        not end: what it waits for."""
        limit = self.now + round(within.total_seconds() * 1000)
        while True:
            await self._settle()
            state = self.state(saga_id)
            if state is not None and state.status.is_terminal:
                return self._result(saga_id, state)
            next_at = await self._next_at()
            if next_at is None or next_at > limit:
                status = state.status.value if state is not None else "never started"
                raise SagaWaits(f"saga {saga_id} is {status} and waits for nothing that comes "
                                f"{'at all' if next_at is None else f'within {within}'}: {self._waiting(saga_id)}")
            self.now = max(self.now, next_at)

    # -- what it holds -----------------------------------------------------------------------------------------

    def history(self, saga_id: str) -> list[ev.Event]:
        """The saga's events so far."""
        return [wire.decode_event(row.body) for row in self.store.events.get(saga_id, [])]

    def state(self, saga_id: str) -> SagaState | None:
        """The saga's state now (the fold of its history)."""
        events = self.history(saga_id)
        return fold(self.definitions.for_history(events), events) if events else None

    # -- the machinery -----------------------------------------------------------------------------------------

    def _send(self, topic: str, key: str, value: bytes, message_id: str, delay_ms: int = 0) -> None:
        copies = 2 if self._duplicate else 1
        for _ in range(copies):
            offset = self._offsets[topic]
            self._offsets[topic] += 1
            record = ConsumedRecord(topic=topic, partition=0, offset=offset, key=key.encode(), value=value,
                                    headers=((MESSAGE_ID, message_id.encode()),))
            heapq.heappush(self._queue, (self.now + delay_ms, next(self._order), record))

    async def _settle(self) -> None:
        """Deliver what is due and fire the timers due now, until nothing more happens at this time."""
        while True:
            progressed = False
            while self._queue and self._queue[0][0] <= self.now:
                _, _, record = heapq.heappop(self._queue)
                await self.service.handle(self._parser.parse(record))
                self._drain()
                progressed = True
            while self._later and self._later[0][0] <= self.now:
                _, _, key, what = heapq.heappop(self._later)
                self._deferred_due(key, what)
                progressed = True
            if await self.service.fire_due_timers(1000):
                self._drain()
                progressed = True
            if not progressed:
                return

    async def _next_at(self) -> int | None:
        due = await self.store.next_due_ms()
        queued = self._queue[0][0] if self._queue else None
        later = self._later[0][0] if self._later else None
        return min((at for at in (due, queued, later) if at is not None), default=None)

    def _drain(self) -> None:
        delivered: list[StepCommand | WithdrawStep] = []
        for message in self.store.drain_outbox():
            if message.topic == self.topics.dlq:
                self.letters.append(wire.decode_dead_letter(message.value))
            elif message.topic == self.topics.control:  # a bulk job's command, as the relay would publish it
                self._send(message.topic, message.key, message.value, message.message_id)
            elif message.topic in self._commands:
                participant = self._commands[message.topic]
                command = wire.decode_participant_command(message.value, participant=participant,
                                                          message_id=message.message_id)
                if isinstance(command, WithdrawStep):
                    self.withdrawn.append(command)
                else:
                    self.sent.append(command)
                for _ in range(2 if self._duplicate else 1):  # a copy is answered from the record
                    if participant in self._down:
                        self._held[participant].append(command)
                    else:
                        delivered.append(command)
        self._deliver(delivered)

    def _deliver(self, commands: list[StepCommand | WithdrawStep]) -> None:
        """Participants pick ``commands`` up, in order, as the kit does a batch."""
        withdrawn_at = {command.idempotency_key: index for index, command in enumerate(commands)
                        if isinstance(command, WithdrawStep)}
        for index, command in enumerate(commands):
            if isinstance(command, WithdrawStep):
                self._withdraw(command)
            elif command.kind is CommandKind.FORWARD and withdrawn_at.get(command.idempotency_key, -1) > index:
                continue  # withdrawn later in the same batch: it does not run, the withdrawal answers for it
            else:
                self._answer(command)

    def _answer(self, command: StepCommand) -> None:
        """A participant handles ``command`` as its script says, keeping its record as the kit does."""
        key = command.idempotency_key
        forward = command.kind is CommandKind.FORWARD
        if forward and key in self._tombstones:
            response = Response("FAILED", self._tombstones[key], "the saga withdrew or compensated this step")
        elif key in self._recorded and not self._taken_up_again(key, command.attempt):
            response = self._recorded[key]
        elif forward and key in self._awaiting:
            self._awaiting[key] = (command, self._awaiting[key][1])  # the answer will carry this attempt
            return
        elif forward and command.expires_at is not None and self.now > command.expires_at:
            response = Response("FAILED", "Expired", "picked up after the attempt expired: not run", True)
        else:
            behaviour = self._scripts.get((command.participant, command.action), succeed())
            response = behaviour.respond(command.attempt)
            if response.deferred:
                self._await(command, response)
                return
            if response.recorded:
                self._record(command, response)
            if command.kind is CommandKind.COMPENSATE:
                forward_of = forward_key(command.saga_id, command.step)
                if forward_of not in self._recorded:
                    self._tombstones[forward_of] = "Compensated"
                    self._awaiting.pop(forward_of, None)
        delay = response.delay_ms
        if response.after_timeout or response.overran:
            delay += (command.timeout_ms or 0) + (1 if response.after_timeout else 0)
        self._reply(command, key, response, delay)

    def _record(self, command: StepCommand, response: Response) -> None:
        key = command.idempotency_key
        self._recorded[key] = Response(response.status, response.error_type, response.message, response.retryable,
                                       response.output)
        self._recorded_attempt[key] = command.attempt
        if response.status == "SUCCEEDED":
            self._effects[(command.saga_id, command.step, command.kind)] += 1

    def _reply(self, command: StepCommand | WithdrawStep, key: str, response: Response, delay_ms: int = 0) -> None:
        kind = CommandKind.FORWARD if isinstance(command, WithdrawStep) else command.kind
        result = StepResult(saga_id=command.saga_id, step=command.step, kind=kind,
                            idempotency_key=key, attempt=command.attempt, status=ResultStatus(response.status),
                            retryable=response.retryable, error_type=response.error_type,
                            error_message=response.message,
                            output=self._output(command.participant, response.output))
        self._send(self.topics.results(command.participant), command.saga_id, wire.encode_result(result),
                   f"{key}:reply:{command.attempt}:{next(self._order)}", delay_ms)

    def _await(self, command: StepCommand, response: Response) -> None:
        """A deferred command: its answer comes ``answer_after_ms`` later, or never; the participant answers
        AnswerTimedOut once the step's timeout passed without it."""
        key = command.idempotency_key
        self._awaiting[key] = (command, response.answer)
        if response.answer_after_ms is not None:
            heapq.heappush(self._later, (self.now + response.answer_after_ms, next(self._order), key, "answer"))
        if command.timeout_ms is not None:
            heapq.heappush(self._later, (self.now + command.timeout_ms, next(self._order), key, "expire"))

    def _deferred_due(self, key: str, what: str) -> None:
        waiting = self._awaiting.get(key)
        if waiting is None:
            return  # answered, timed out or withdrawn already
        command, answer = waiting
        if what == "answer":
            if answer is None:
                return
            del self._awaiting[key]
            if answer.recorded:
                self._record(command, answer)
            self._reply(command, key, answer)
        else:
            del self._awaiting[key]
            timed_out = Response("FAILED", "AnswerTimedOut", "no answer came within the step's timeout")
            self._record(command, timed_out)
            self._reply(command, key, timed_out)

    def _withdraw(self, withdrawal: WithdrawStep) -> None:
        """As the kit does: the forward key is fenced, and the answer says whether the command had run."""
        key = withdrawal.idempotency_key
        self._awaiting.pop(key, None)
        recorded = self._recorded.get(key)
        if key in self._tombstones:
            response = Response("FAILED", self._tombstones[key], "the saga withdrew or compensated this step")
        elif recorded is not None and recorded.status == "SUCCEEDED":
            response = recorded
        elif recorded is not None:
            self._tombstones[key] = recorded.error_type or "Withdrawn"
            response = recorded
        else:
            self._tombstones[key] = "Withdrawn"
            response = Response("FAILED", "Withdrawn", f"withdrawn before it ran: {withdrawal.reason}")
        self._reply(withdrawal, key, response)

    def _taken_up_again(self, key: str, attempt: int) -> bool:
        """As the kit's ledger does: a recorded definitive failure is run again by a later attempt of its key (a
        Redrive, a resume); a recorded success answers every attempt."""
        return self._recorded[key].status == "FAILED" and attempt > self._recorded_attempt[key]

    def _output(self, participant: str, output: BaseModel | bytes | None) -> bytes | None:
        """``output`` as the record of ``participant``'s action that gives it (one model may be the output of
        two participants' actions, a record in each one's namespace)."""
        if output is None or isinstance(output, bytes):
            return output
        record = self._outputs.get((participant, type(output)))
        if record is None:
            records = [record for record in self._records.values() if record.model is type(output)]
            if not records:
                raise TypeError(f"{type(output).__name__} is the output of no action of the environment's sagas")
            record = records[0]
        return self.schemas.encode(record.full_name, to_avro(output))

    def _result(self, saga_id: str, state: SagaState) -> SagaResult:
        events = self.history(saga_id)
        steps = {step for (saga, step, _) in self._effects if saga == saga_id}
        effects = {step: (self._effects[(saga_id, step, CommandKind.FORWARD)],
                          self._effects[(saga_id, step, CommandKind.COMPENSATE)]) for step in sorted(steps)}
        outputs = {event.step: self._decoded(event.output) for event in events
                   if isinstance(event, ev.StepSucceeded) and event.output}
        return SagaResult(saga_id, state.status.value, events, [c for c in self.sent if c.saga_id == saga_id],
                          effects, timedelta(milliseconds=self.now - self._started_at.get(saga_id, self.now)),
                          outputs, self.definitions.for_history(events),
                          [w for w in self.withdrawn if w.saga_id == saga_id])

    def _decoded(self, output: bytes) -> BaseModel | bytes:
        try:
            full_name, record = self.schemas.decode(output)
        except Exception:  # not a typed record: the bytes as they are
            return output
        known = self._records.get(full_name)
        return from_avro(known.model, record) if known is not None else output

    def _waiting(self, saga_id: str) -> str:
        state = self.state(saga_id)
        if state is None:
            return "no SagaStarted (see the environment's letters)" if self.letters else "nothing recorded"
        settled = {"PENDING", "SUCCEEDED", "FAILED", "SKIPPED", "COMPENSATED"}
        pending = [f"{name} ({step.status.value})" for name, step in state.steps.items()
                   if step.status.value not in settled]
        stopped = [f"participant {name} stopped, {len(held)} command(s) waiting" for name, held in self._held.items()
                   if any(command.saga_id == saga_id for command in held)]
        return ", ".join([*pending, *stopped]) or state.status.value


def _definitions(deployment: Iterable[Deployment]) -> list[SagaDefinition]:
    return [definition for item in deployment for definition in _definitions_of(item)]


def _definitions_of(item: Deployment) -> list[SagaDefinition]:
    """The definitions of one item of a deployment; ValueError names what its app cannot run (a participant
    nobody serves, an action its participant lacks), as every process of that app would refuse it."""
    if isinstance(item, SagaApp):
        problems = item.problems()
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ValueError(f"the app cannot run: {problems[0]}{more}")
        return item.definitions()
    return [item.definition if isinstance(item, Saga) else item]


def _records(deployment: Iterable[Deployment]) -> dict[str, Record]:
    """The typed records of the deployment, by full name."""
    return {record.full_name: record for item in deployment
            for record in (item.records() if isinstance(item, SagaApp | Saga) else [])}


def _outputs(deployment: Iterable[Deployment]) -> dict[tuple[str, type[BaseModel]], Record]:
    """The record of each (participant, output model) the deployment's typed actions give."""
    outputs: dict[tuple[str, type[BaseModel]], Record] = {}
    for item in deployment:
        sagas = [saga for saga in item.sagas if isinstance(saga, Saga)] if isinstance(item, SagaApp) else (
            [item] if isinstance(item, Saga) else [])
        for action in (action for saga in sagas for action in saga.actions()):
            record = action.output_record
            if record is not None:
                outputs[(action.participant_name, record.model)] = record
    return outputs


def _schemas(records: Mapping[str, Record]) -> SchemaRegistry:
    """The contract's schemas, the default schema path's (the trip's input) and the typed records', which win over
    a schema of the same name on the default path (a deployment loaded earlier in the process may have put its own
    folder there, with another record of that name)."""
    base = default_registry()
    if not records:
        return base
    with tempfile.TemporaryDirectory() as folder:
        for name, schema in schema_files(records.values()).items():
            path = Path(folder) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(schema))
        typed = list(load_tree(Path(folder)).values())
    own = {schema.full_name for schema in typed}
    return SchemaRegistry([*(s for s in base.current_schemas() if s.full_name not in own), *typed],
                          base.released_schemas())



for _action in SAGA_ACTIONS:  # the help of each lever of the kit is its row's
    getattr(SagaEnvironment, action_name(_action)).__doc__ = (
        f"Send {_action} (operator \"test\"): {ACTION_RULES[_action].does}; the saga runs on.")
