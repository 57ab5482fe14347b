"""Participants declared with decorators: typed actions, built into the kit's ``Participant``.

    inventory = participant("inventory", tables=["CREATE TABLE IF NOT EXISTS inventory.holds (...)"])

    @inventory.action
    async def reserve_stock(step: StepContext, order: Order) -> Reservation | Failed:
        ...

    @reserve_stock.undo
    async def release_stock(step: StepContext, order: Order, held: Reservation) -> None:
        ...

An action is named after its function (``name=`` names it otherwise); its compensation too. A handler gets a
``StepContext`` (the kit's transaction ``step.tx`` and the command's saga id, step, attempt and idempotency
key), the saga's input as its pydantic model, and, as further parameters annotated with their models, the
outputs of the steps it depends on (matched by the model's class name; a parameter that may be missing is
``Model | None``); a compensation also gets its own step's output, the thing to undo. It returns its output
model, ``None`` (no output), ``Failed(...)`` or ``Deferred()``, or raises ``StepFailed(...)`` (so its return type
can name its output alone). ``many=True`` declares a batch handler: it gets
the transaction and the consecutive commands of its action as ``Calling`` items, and returns a result for each.

The engine's form stays the kit's ``Participant``: ``ParticipantSpec.build`` makes one whose handlers decode the
input and outputs (Avro, ``schemas.typed``), call the typed function and encode what it returns, in the
participant's namespace (``saga.v1.<name>`` unless given).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Union, overload

from pydantic import BaseModel, ValidationError

from ...schemas.registry import default_registry
from ...schemas.typed import OUTPUTS_FOLDER, Record, from_avro, to_avro
from .effects import EffectTable
from .outcome import Deferred, Failed, Outcome, ReceivedCommand, StepFailed, Succeeded
from .participant import BatchHandler, Call, Handler, Participant

if TYPE_CHECKING:
    import asyncpg

__all__ = ["Action", "Calling", "ParticipantSpec", "StepContext", "participant"]

InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT", bound=BaseModel)
Result = BaseModel | Failed | Deferred | Succeeded | None


@dataclass
class _Reply:
    delay_ms: int = 0


@dataclass(frozen=True)
class StepContext:
    """What a typed handler is given besides its inputs: the kit's transaction and the command's facts.

    ``outputs``: the outputs its parameters take, by the name of the step that gave each (e.g. to record
    them); ``schema``: the participant's Postgres schema, where its tables are (``f"{step.schema}.ledger"``).
    """

    tx: asyncpg.Connection
    command: ReceivedCommand
    outputs: Mapping[str, BaseModel] = field(default_factory=dict)
    schema: str = "public"
    _reply: _Reply = field(default_factory=_Reply, repr=False, compare=False)

    @property
    def saga_id(self) -> str:
        return self.command.saga_id

    @property
    def step(self) -> str:
        return self.command.step

    @property
    def attempt(self) -> int:
        return self.command.attempt

    @property
    def idempotency_key(self) -> str:
        """Pass it on to an outside system as its idempotency key: a command can be handled more than once."""
        return self.command.idempotency_key

    def hold_reply(self, milliseconds: int) -> None:
        """Keep the reply in the outbox for ``milliseconds`` after the commit (a slow participant, simulated)."""
        self._reply.delay_ms = milliseconds


@dataclass(frozen=True)
class Calling(Generic[InputT]):
    """One command of a batch handler's batch: its context, the saga input and the outputs it was given."""

    step: StepContext
    input: InputT
    outputs: Mapping[str, BaseModel] = field(default_factory=dict)  # by model class name

    def output(self, model: type[OutputT]) -> OutputT:
        """The output of type ``model`` this call carries (one its action ``needs=``); KeyError when it has none
        (a ``Model | None`` need that was missing)."""
        return typing.cast(OutputT, self.outputs[model.__name__])  # _read decoded it as that model


@dataclass(frozen=True)
class _Need:
    model: type[BaseModel]
    optional: bool


class Action:
    """A participant's typed action: its handler, what it reads and gives, and its compensation (``undo``)."""

    def __init__(self, spec: ParticipantSpec, handler: Callable[..., Awaitable[Any]], name: str, many: bool,
                 compensates: Action | None = None, effect: str | None = None, needs: Sequence[Any] = ()) -> None:
        self.spec = spec
        self.handler = handler
        self.name = name
        self.many = many
        self.effect = effect  # the count of the participant's EffectTable its effect adds to
        self.compensates = compensates  # the forward action this one undoes
        self.compensation: Action | None = None
        self.input_model, self.needs, self.output_model = _signature(handler, many, name)
        if needs and not many:
            raise TypeError(f"action {name!r}: needs= is for a batch action (many=True); a handler of one command "
                            "names the outputs it needs as parameters")
        for need in (_need(hint, name, "needs") for hint in needs):
            self.needs[need.model.__name__] = need

    @property
    def participant_name(self) -> str:
        return self.spec.name

    @property
    def undo_name(self) -> str | None:
        return self.compensation.name if self.compensation is not None else None

    @property
    def output_record(self) -> Record | None:
        """The Avro record of its output (in the participant's namespace), None when it gives none."""
        return None if self.output_model is None else Record(self.output_model, self.spec.namespace, OUTPUTS_FOLDER)

    @overload
    def undo(self, handler: Callable[..., Awaitable[Any]], /, *, name: str | None = None,
             effect: str | None = None) -> Action: ...

    @overload
    def undo(self, handler: None = None, /, *, name: str | None = None, effect: str | None = None
             ) -> Callable[[Callable[..., Awaitable[Any]]], Action]: ...

    def undo(self, handler: Callable[..., Awaitable[Any]] | None = None, /, *, name: str | None = None,
             effect: str | None = None) -> Action | Callable[[Callable[..., Awaitable[Any]]], Action]:
        """Declare the compensation of this action (a decorator, bare or with ``name=`` / ``effect=``, the count
        of the participant's effect table that shows it undone)."""
        def declare(function: Callable[..., Awaitable[Any]]) -> Action:
            if self.compensation is not None:
                raise ValueError(f"action {self.name!r} of {self.spec.name!r} already has a compensation")
            undo = self.spec._add(Action(self.spec, function, name or function.__name__, False, compensates=self,
                                         effect=effect))
            self.compensation = undo
            return undo
        return declare if handler is None else declare(handler)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler itself (in a test, with a context of your own)."""
        return await self.handler(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<action {self.spec.name}.{self.name}>"


class ParticipantSpec:
    """A participant declared with typed actions; ``build`` makes the kit's ``Participant`` the worker runs."""

    def __init__(self, name: str, *, schema: str | None = None, tables: Sequence[str] = (),
                 namespace: str | None = None, effects: EffectTable | None = None) -> None:
        self.name = name
        self.schema = schema or name
        self.tables = tuple(tables)
        self.namespace = namespace or f"saga.v1.{name}"
        self.effects = effects
        self.actions: dict[str, Action] = {}

    @overload
    def action(self, handler: Callable[..., Awaitable[Any]], /, *, name: str | None = None, many: bool = False,
               effect: str | None = None, needs: Sequence[Any] = ()) -> Action: ...

    @overload
    def action(self, handler: None = None, /, *, name: str | None = None, many: bool = False,
               effect: str | None = None, needs: Sequence[Any] = ()
               ) -> Callable[[Callable[..., Awaitable[Any]]], Action]: ...

    def action(self, handler: Callable[..., Awaitable[Any]] | None = None, /, *, name: str | None = None,
               many: bool = False, effect: str | None = None, needs: Sequence[Any] = ()
               ) -> Action | Callable[[Callable[..., Awaitable[Any]]], Action]:
        """Declare an action (a decorator, bare or with ``name=``, ``many=True``, ``effect=``: the count of the
        participant's effect table its effect adds to, or, for a batch action, ``needs=``: the output models of
        earlier steps each of its calls must carry, ``Model | None`` for one that may be missing)."""
        def declare(function: Callable[..., Awaitable[Any]]) -> Action:
            return self._add(Action(self, function, name or function.__name__, many, effect=effect, needs=needs))
        return declare if handler is None else declare(handler)

    def _add(self, action: Action) -> Action:
        if action.name in self.actions:
            raise ValueError(f"participant {self.name!r} already has an action {action.name!r}")
        if action.effect is not None and (self.effects is None or action.effect not in self.effects.counts):
            counts = ", ".join(self.effects.counts) if self.effects is not None else "no effect table"
            raise ValueError(f"action {action.name!r} of {self.name!r}: effect {action.effect!r} is not a count of "
                             f"the participant's effects ({counts})")
        self.actions[action.name] = action
        return action

    def effect_table(self) -> EffectTable | None:
        """Its effect table, with the counts its actions' ``effect=`` name."""
        if self.effects is None:
            return None
        named = {action.name: action.effect for action in self.actions.values() if action.effect is not None}
        return replace(self.effects, actions={**self.effects.actions, **named})

    def records(self) -> list[Record]:
        """The Avro records of its actions' outputs."""
        return [record for action in self.actions.values() if (record := action.output_record) is not None]

    def build(self, input_types: frozenset[str] = frozenset()) -> Participant:
        """The kit's Participant of these actions; ``input_types``: the saga input records it reads (empty:
        any)."""
        handlers: dict[str, Handler] = {}
        batch_handlers: dict[str, BatchHandler] = {}
        for action in self.actions.values():
            if action.many:
                batch_handlers[action.name] = _batch_handler(action)
            else:
                handlers[action.name] = _handler(action)
        return Participant(name=self.name, schema=self.schema, handlers=handlers, batch_handlers=batch_handlers,
                           business_ddl=self.tables, input_types=input_types, effects=self.effect_table(),
                           answers={action.name: _answer_reader(action) for action in self.actions.values()})

    def __repr__(self) -> str:
        return f"<participant {self.name}: {', '.join(self.actions)}>"


def participant(name: str, *, schema: str | None = None, tables: Sequence[str] = (),
                namespace: str | None = None, effects: EffectTable | None = None) -> ParticipantSpec:
    """Declare a participant: ``name`` (its topics ``<name>.commands`` / ``<name>.results``), its Postgres
    ``schema`` (default: the name), the DDL of its business ``tables`` (idempotent statements run at start),
    the Avro ``namespace`` of its outputs (default ``saga.v1.<name>``) and where its effects show
    (``effects``: what ``saga effects`` and ``saga verify`` read; its actions' ``effect=`` name the counts)."""
    return ParticipantSpec(name, schema=schema, tables=tables, namespace=namespace, effects=effects)


# -- the typed handler as the kit runs it --------------------------------------------------------------------

def _handler(action: Action) -> Handler:
    async def handle(conn: asyncpg.Connection, command: ReceivedCommand, saga_input: Mapping[str, Any]) -> Outcome:
        read = _read(action, command, saga_input)
        if isinstance(read, Failed):
            return read
        value, outputs, by_step = read
        kwargs = _arguments(action, outputs)
        if isinstance(kwargs, Failed):
            return kwargs
        context = StepContext(conn, command, by_step, action.spec.schema)
        try:
            return _outcome(action, await action.handler(context, value, **kwargs), context)
        except StepFailed as failed:
            return failed.outcome()
    return handle


def _batch_handler(action: Action) -> BatchHandler:
    async def handle(conn: asyncpg.Connection, calls: Sequence[Call]) -> list[Outcome]:
        items: list[Calling[Any]] = []
        refused: dict[int, Failed] = {}
        for index, (command, saga_input) in enumerate(calls):
            read = _read(action, command, saga_input)
            if isinstance(read, Failed):
                refused[index] = read
                continue
            value, outputs, by_step = read
            checked = _arguments(action, outputs)  # a call without an output it needs is refused alone
            if isinstance(checked, Failed):
                refused[index] = checked
                continue
            items.append(Calling(StepContext(conn, command, by_step, action.spec.schema), value, outputs))
        try:
            given = list(await action.handler(conn, items)) if items else []
        except StepFailed as failed:  # the whole batch fails alike
            given = [failed.outcome()] * len(items)
        if len(given) != len(items):
            raise RuntimeError(f"batch action {action.name!r} returned {len(given)} results for {len(items)}")
        outcomes = iter([_outcome(action, result, item.step) for result, item in zip(given, items, strict=True)])
        return [refused[index] if index in refused else next(outcomes) for index in range(len(calls))]
    return handle


def _read(action: Action, command: ReceivedCommand, saga_input: Mapping[str, Any]
          ) -> tuple[BaseModel, dict[str, BaseModel], dict[str, BaseModel]] | Failed:
    """The typed input and the decoded outputs of a command (by model class name, and by step), or the
    definitive failure that they do not fit."""
    try:
        value = action.input_model.model_validate(dict(saga_input))
    except ValidationError as error:
        return Failed("UnsupportedInput", f"{action.spec.name}.{action.name} cannot read {command.input_type}: "
                                          f"{_first_error(error)}")
    outputs: dict[str, BaseModel] = {}
    by_step: dict[str, BaseModel] = {}
    registry = default_registry()
    wanted = {need.model.__name__: need.model for need in action.needs.values()}
    for step, data in command.step_outputs.items():
        if not data:
            continue
        try:
            full_name, record = registry.decode(data)
        except Exception:  # an output that is not a typed record (bytes of a 0.1 participant): not matched
            continue
        model = wanted.get(full_name.rpartition(".")[2])
        if model is not None:
            try:
                outputs[model.__name__] = by_step[step] = from_avro(model, record)
            except ValidationError as error:
                return Failed("UnsupportedInput", f"the output of step {step} does not fit {model.__name__}: "
                                                  f"{_first_error(error)}")
    return value, outputs, by_step


def _arguments(action: Action, outputs: Mapping[str, BaseModel]) -> dict[str, BaseModel | None] | Failed:
    arguments: dict[str, BaseModel | None] = {}
    for parameter, need in action.needs.items():
        found = outputs.get(need.model.__name__)
        if found is None and not need.optional:
            return Failed("MissingOutput", f"{action.spec.name}.{action.name} needs the output {need.model.__name__}"
                                           " of an earlier step, and the command carries none")
        arguments[parameter] = found
    return arguments


def _outcome(action: Action, result: Any, context: StepContext) -> Outcome:
    """What a typed handler returned, as the kit replies it (an output model encoded as its Avro record; held
    back as long as ``context.hold_reply`` asked)."""
    delay_ms = context._reply.delay_ms
    if isinstance(result, Failed | Deferred | Succeeded):
        return result
    if result is None:
        return Succeeded(reply_delay_ms=delay_ms)
    record = action.output_record
    if record is None or not isinstance(result, record.model):
        raise TypeError(f"{action.spec.name}.{action.name} returned {type(result).__name__}, not its declared "
                        f"{action.output_model.__name__ if action.output_model else 'None'}, Failed or Deferred")
    return Succeeded(default_registry().encode(record.full_name, to_avro(result)), reply_delay_ms=delay_ms)


def _answer_reader(action: Action) -> Callable[[bytes | None], bytes | None]:
    """How a person's answer to ``action``'s deferred command becomes its output (``Participant.answers``)."""
    record = action.output_record
    where = f"{action.spec.name}.{action.name}"

    def read(text: bytes | None) -> bytes | None:
        if record is None:
            if text is None or text.strip() in (b"", b"{}", b"null"):
                return None
            raise ValueError(f"{where} gives no output: answer it without one ('{{}}')")
        try:
            value = record.model.model_validate_json(text or b"")
        except ValidationError as error:
            raise ValueError(f"the answer does not fit {record.model.__name__}, the output of {where}: "
                             f"{_first_error(error)}") from None
        return default_registry().encode(record.full_name, to_avro(value))
    return read


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    return f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"


# -- reading a handler's signature --------------------------------------------------------------------------

def _signature(handler: Callable[..., Any], many: bool, name: str
               ) -> tuple[type[BaseModel], dict[str, _Need], type[BaseModel] | None]:
    """(input model, further parameters and their models, output model) of a typed handler."""
    hints = typing.get_type_hints(handler)
    parameters = list(inspect.signature(handler).parameters.values())
    if len(parameters) < 2:
        raise TypeError(f"action {name!r}: a handler takes the step context and the saga input "
                        f"(async def {name}(step: StepContext, order: Order, ...))")
    if many:  # async def book(tx, calls: Sequence[Calling[Order]]) -> list[Booking | Failed]
        calling = typing.get_args(hints.get(parameters[1].name))
        model = typing.get_args(calling[0]) if calling else ()
        if not model or not _is_model(model[0]):
            raise TypeError(f"batch action {name!r}: annotate its calls as Sequence[Calling[YourInput]]")
        item = typing.get_args(hints.get("return"))
        return model[0], {}, _output_model(item[0] if item else None, name)
    input_model = hints.get(parameters[1].name)
    if not isinstance(input_model, type) or not issubclass(input_model, BaseModel):
        raise TypeError(f"action {name!r}: annotate its second parameter with the saga input's pydantic model")
    needs = {parameter.name: _need(hints.get(parameter.name), name, parameter.name) for parameter in parameters[2:]}
    return input_model, needs, _output_model(hints.get("return"), name)


def _need(hint: Any, action: str, parameter: str) -> _Need:
    members = _members(hint)
    models = [member for member in members if _is_model(member)]
    if len(models) != 1 or any(member not in (*models, type(None)) for member in members):
        raise TypeError(f"action {action!r}: annotate parameter {parameter!r} with the pydantic model of the "
                        "output it needs (or Model | None)")
    return _Need(models[0], type(None) in members)


def _output_model(hint: Any, action: str) -> type[BaseModel] | None:
    members = [member for member in _members(hint) if member is not type(None)]
    models = [member for member in members if _is_model(member)]
    others = [member for member in members if member not in models and member not in (Failed, Deferred, Succeeded)]
    if len(models) > 1 or others:
        raise TypeError(f"action {action!r}: return one pydantic model (its output), None, Failed or Deferred")
    return models[0] if models else None


def _members(hint: Any) -> list[Any]:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return list(typing.get_args(hint))
    return [hint]


def _is_model(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, BaseModel)
