"""Saga types and the app object (``saga_orchestrator.authoring`` is where users import them from).

What a team writes: a saga type in one module, typed, and the one app object of a deployment.

    class Order(BaseModel): ...                       # the saga's input, and each step's output: pydantic models

    inventory = participant("inventory", tables=[...],     # where its effects show: saga effects / verify
                            effects=EffectTable("ledger", counts={"done": None, "undone": "state = 'released'"}))

    @inventory.action(effect="done")
    async def reserve_stock(step: StepContext, order: Order) -> Reservation | Failed: ...

    checkout = Saga("checkout", input=Order)
    reserve = checkout.step(reserve_stock, timeout=timedelta(seconds=2))
    ship = checkout.step(create_shipment, after=[reserve], pivot=True)
    approval = checkout.signal(Approval)                       # a pydantic model others send: `saga signal`
    approved = checkout.wait(approval, after=[reserve], timeout=timedelta(hours=48), on_expiry=Expiry.FAIL)

    app = SagaApp(sagas=[checkout], participants=[inventory, ...], schema_folder="shop/schemas")

A step refers to its action by the object, so a participant's or an action's name is written once, where it is
declared. The engine's form stays the data the core reads: ``Saga.definition`` is a ``SagaDefinition`` and
``SagaApp.participant(name)`` a kit ``Participant``. Every process takes its saga types, records and
participants from the app that SAGA_APP (or ``[tool.saga] app`` in pyproject.toml) names (``infra.app``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from ..orchestrator.domain.definition import (
    UNLIMITED_RETRY,
    Condition,
    Expiry,
    FailureMode,
    RetryPolicy,
    SagaDefinition,
    Step,
)
from ..orchestrator.domain.errors import DefinitionError
from ..participants.kit.participant import Participant
from ..participants.kit.typed import Action, ParticipantSpec
from ..schemas.typed import INPUTS_FOLDER, SIGNALS_FOLDER, Record


@dataclass(frozen=True)
class SignalRef:
    """A signal a saga type takes (``Saga.signal``): its name, and the record its payload is."""

    name: str
    record: Record

    @property
    def model(self) -> type[BaseModel]:
        return self.record.model


@dataclass(frozen=True)
class StepRef:
    """A step of a saga, as ``after=`` names it: one that runs ``action``, or one that waits for ``signal``."""

    name: str
    action: Action | None = None
    signal: SignalRef | None = None
    go_on: bool = False  # a wait that goes on without its signal when it expires: its output may be missing

    @property
    def gives(self) -> type[BaseModel] | None:
        """The model of its output (the signal's, for a wait)."""
        if self.signal is not None:
            return self.signal.model
        return None if self.action is None else self.action.output_model


class Saga:
    """A saga type built from typed actions: ``step`` adds one; ``definition`` is the engine's form.

    ``input``: the pydantic model of its input, the Avro record ``<namespace>.<Model>`` (``namespace``: default
    ``saga.v1.<saga_type>``). ``deadline``: the time from the start within which it must pass its pivot (or end,
    without one), else it is cancelled. ``searchable``: input fields (text, whole numbers or booleans) its sagas
    are found by in the console and the HTTP API, a customer id or an order number.
    """

    def __init__(self, saga_type: str, *, input: type[BaseModel], version: int = 1, namespace: str | None = None,
                 failure_mode: FailureMode = FailureMode.FAIL_FAST, compensate_on_continue: bool = False,
                 deadline: timedelta | None = None, searchable: Sequence[str] = ()) -> None:
        self.saga_type = saga_type
        self.searchable = _searchable(saga_type, input, searchable)
        self.version = version
        self.input_record = Record(input, namespace or f"saga.v1.{saga_type}", INPUTS_FOLDER)
        self.failure_mode = failure_mode
        self.compensate_on_continue = compensate_on_continue
        self.deadline = deadline
        self.steps: list[tuple[StepRef, Step]] = []
        self.signals: dict[str, SignalRef] = {}
        self._namespace = namespace or f"saga.v1.{saga_type}"

    def signal(self, model: type[BaseModel], *, name: str | None = None) -> SignalRef:
        """Declare a signal its sagas take: ``model`` (a pydantic model) is the record ``<namespace>.<Model>`` a
        SignalSaga carries; ``name`` (default: the model's class name) is what senders call it. Send it with
        ``saga signal``, ``SagaClient.signal``, the console, or a SignalSaga on saga.control."""
        self._not_built()
        ref = SignalRef(name or model.__name__, Record(model, self._namespace, SIGNALS_FOLDER))
        if ref.name in self.signals:
            raise DefinitionError(f"saga {self.saga_type!r}: signal {ref.name!r} is declared twice")
        self.signals[ref.name] = ref
        return ref

    def wait(self, signal: SignalRef, *, timeout: timedelta, on_expiry: Expiry = Expiry.FAIL, name: str | None = None,
             after: Sequence[StepRef] = (), skippable: bool = False, patch: str | None = None) -> StepRef:
        """Add a step that waits for ``signal`` once the steps ``after`` names are settled (one taken before it
        waits is taken at once): it succeeds with the signal's payload as its output, which later steps take as a
        typed parameter. Without the signal within ``timeout`` it fails for good (``Expiry.FAIL``: before the
        pivot the saga turns back) or goes on without it (``Expiry.GO_ON``: later steps take ``Model | None``)."""
        self._not_built()
        if self.signals.get(signal.name) is not signal:
            raise DefinitionError(f"saga {self.saga_type!r}: signal {signal.name!r} is not one of its own; declare it "
                                  f"with {self.saga_type}.signal(...)")
        ref = StepRef(name or f"await_{_snake(signal.name)}", signal=signal, go_on=on_expiry is Expiry.GO_ON)
        retry = UNLIMITED_RETRY if _after_pivot(self, after) else RetryPolicy(max_attempts=1)
        self.steps.append((ref, Step(
            name=ref.name, participant="", command="", depends_on=tuple(step.name for step in after),
            retry=retry, timeout_ms=_ms(timeout), skippable=skippable, signal=signal.name, on_expiry=on_expiry,
            patch=patch)))
        return ref

    def _not_built(self) -> None:
        if self.__dict__.get("definition") is not None:
            raise DefinitionError(f"saga {self.saga_type!r}: its definition was already built; add steps first")

    def step(self, action: Action, *, name: str | None = None, after: Sequence[StepRef] = (),
             retry: RetryPolicy | None = None, undo_retry: RetryPolicy = UNLIMITED_RETRY,
             timeout: timedelta = timedelta(seconds=5), undo_timeout: timedelta = timedelta(seconds=5),
             pivot: bool = False, run_if: Condition = Condition.ON_SUCCESS, skippable: bool = False,
             patch: str | None = None) -> StepRef:
        """Add a step running ``action`` once the steps ``after`` names are settled; it is undone by the action's
        compensation. ``retry``: default three attempts (``RetryPolicy()``), and no limit for a step after the
        pivot, as the saga only moves forward there. ``patch``: the step is added to a version whose sagas are
        running, behind the marker of that name (``Step.patch``): the sagas that went past where it runs keep their
        path, the others take it."""
        self._not_built()
        ref = StepRef(name or action.name, action)
        chosen = retry if retry is not None else (UNLIMITED_RETRY if _after_pivot(self, after) else RetryPolicy())
        self.steps.append((ref, Step(
            name=ref.name, participant=action.participant_name, command=action.name,
            compensation=action.undo_name, depends_on=tuple(step.name for step in after), retry=chosen,
            compensation_retry=undo_retry, timeout_ms=_ms(timeout), compensation_timeout_ms=_ms(undo_timeout),
            pivot=pivot, run_if=run_if, skippable=skippable, patch=patch)))
        return ref

    @functools.cached_property
    def definition(self) -> SagaDefinition:
        """The engine's form of this saga type (validated: every step's needed outputs come from steps before)."""
        definition = SagaDefinition(
            saga_type=self.saga_type, version=self.version, input_schema=self.input_record.full_name,
            steps=tuple(step for _, step in self.steps), failure_mode=self.failure_mode,
            compensate_on_continue=self.compensate_on_continue,
            deadline_ms=None if self.deadline is None else _ms(self.deadline), searchable=self.searchable,
            signals=tuple((ref.name, ref.record.full_name) for ref in self.signals.values()))
        self._check_needs(definition)
        return definition

    def actions(self) -> list[Action]:
        """The actions its steps run, their compensations after them."""
        actions = [ref.action for ref, _ in self.steps if ref.action is not None]
        return actions + [action.compensation for action in actions if action.compensation is not None]

    def records(self) -> list[Record]:
        """Its input record, the output records of its actions and the records of its signals."""
        return [self.input_record, *(record for action in self.actions()
                                     if (record := action.output_record) is not None),
                *(signal.record for signal in self.signals.values())]

    def _check_needs(self, definition: SagaDefinition) -> None:
        refs = {ref.name: ref for ref, _ in self.steps}
        for ref, _ in self.steps:
            if ref.action is None:
                continue
            before = definition.upstream(ref.name)
            for action, available in ((ref.action, before), (ref.action.compensation, before | {ref.name})):
                if action is None:
                    continue
                for parameter, need in action.needs.items():
                    if need.optional or any(refs[step].gives is need.model and not refs[step].go_on
                                            for step in available):
                        continue
                    raise DefinitionError(
                        f"saga {self.saga_type!r} step {ref.name!r}: {action.participant_name}.{action.name} takes "
                        f"{parameter}: {need.model.__name__}, which no step before it gives for sure (make it "
                        f"{need.model.__name__} | None, or run the step after the one that gives it)")


class SagaApp:
    """A deployment's saga types and participants, in one object every process takes from SAGA_APP.

    ``sagas``: ``Saga`` objects (or engine ``SagaDefinition``s, older versions kept running among them);
    ``participants``: ``participant(...)`` declarations (or kit ``Participant``s); ``schema_folder``: where
    ``saga schemas write`` writes their Avro records and where every process reads them.
    """

    def __init__(self, *, sagas: Iterable[Saga | SagaDefinition] = (),
                 participants: Iterable[ParticipantSpec | Participant] = (),
                 schema_folder: str | Path | None = None) -> None:
        self.sagas = list(sagas)
        self.participants = {p.name: p for p in participants}
        self.schema_folder = None if schema_folder is None else Path(schema_folder)
        self._built: dict[str, Participant] = {}

    def definitions(self) -> list[SagaDefinition]:
        """The engine's definitions of its saga types."""
        return [saga.definition if isinstance(saga, Saga) else saga for saga in self.sagas]

    def participant_names(self) -> list[str]:
        return list(self.participants)

    def participant(self, name: str) -> Participant:
        """The kit Participant called ``name``, reading the input records of the sagas that use it (built once)."""
        declared = self.participants.get(name)
        if declared is None:
            raise KeyError(name)
        if isinstance(declared, Participant):
            return declared
        if name not in self._built:
            reads = frozenset(definition.input_schema for definition in self.definitions()
                              if any(step.participant == name for step in definition.steps))
            self._built[name] = declared.build(input_types=reads)
        return self._built[name]

    def records(self) -> list[Record]:
        """Every typed record of its sagas and participants (the engine definitions' records are files)."""
        records = {record for saga in self.sagas if isinstance(saga, Saga) for record in saga.records()}
        records |= {record for spec in self.participants.values() if isinstance(spec, ParticipantSpec)
                    for record in spec.records()}
        return sorted(records, key=lambda record: (record.folder, record.full_name))

    def problems(self) -> list[str]:
        """What cannot work (a participant a saga names that nobody serves; an action a saga names that its
        participant lacks), one line each."""
        found = []
        for definition in self.definitions():
            for step in (step for step in definition.steps if not step.waits):
                where = f"saga {definition.saga_type} (version {definition.version}) step {step.name}"
                declared = self.participants.get(step.participant)
                if declared is None:
                    found.append(f"{where} sends to participant {step.participant}, which no participant of the "
                                 f"app serves (known: {', '.join(sorted(self.participants)) or 'none'})")
                    continue
                actions = set(declared.actions)  # a ParticipantSpec's by name, a Participant's served ones
                for action in (step.command, step.compensation):
                    if action is not None and action not in actions:
                        found.append(f"{where} names action {action} of participant {step.participant}, which has "
                                     f"no such action (it has: {', '.join(sorted(actions))})")
        return found


class _Steps(Protocol):
    steps: list[tuple[StepRef, Step]]


def _after_pivot(saga: _Steps, after: Sequence[StepRef]) -> bool:
    """Whether a step run after ``after`` comes after the saga's pivot (directly or not)."""
    pivots = {ref.name for ref, step in saga.steps if step.pivot}
    if not pivots:
        return False
    depends = {ref.name: set(step.depends_on) for ref, step in saga.steps}
    seen, todo = set(), [ref.name for ref in after]
    while todo:
        name = todo.pop()
        if name in pivots:
            return True
        if name not in seen:
            seen.add(name)
            todo.extend(depends.get(name, ()))
    return False


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))


def _ms(delta: timedelta) -> int:
    return round(delta.total_seconds() * 1000)


def _searchable(saga_type: str, model: type[BaseModel], names: Sequence[str]) -> tuple[str, ...]:
    """``names`` checked: each a field of ``model`` holding text, a whole number or a boolean (else
    DefinitionError naming it)."""
    for name in names:
        field = model.model_fields.get(name)
        if field is None:
            raise DefinitionError(f"saga {saga_type!r}: searchable field {name!r} is not a field of "
                                  f"{model.__name__} (its fields: {', '.join(model.model_fields)})")
        if field.annotation not in (str, int, bool, str | None, int | None):
            raise DefinitionError(f"saga {saga_type!r}: searchable field {name!r} must hold text, a whole number "
                                  f"or a boolean, not {field.annotation}")
    if len(set(names)) != len(names):
        raise DefinitionError(f"saga {saga_type!r}: a searchable field is named twice in {list(names)}")
    return tuple(names)
