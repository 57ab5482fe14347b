"""Saga definitions as data: steps, their dependencies, retry policies, pivot and failure mode.

A definition is validated when it is built, so a definition that exists can run: no unknown dependency, no
cycle, no duplicate step, and a pivot that splits the saga into a compensable part and a forward-only part.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ...schemas.event_types import Event, SagaMigrated, SagaStarted
from .errors import DefinitionError, UnknownDefinition


class FailureMode(StrEnum):
    """What a definitive step failure does to the rest of the saga."""

    FAIL_FAST = "FAIL_FAST"  # stop dispatching, compensate what completed
    CONTINUE = "CONTINUE"  # keep running independent steps, skip the failed step's dependents


class Condition(StrEnum):
    """When a step runs once its dependencies are settled."""

    ON_SUCCESS = "ON_SUCCESS"  # every dependency succeeded
    ON_FAILURE = "ON_FAILURE"  # some step upstream of it failed (CONTINUE mode only)
    ALWAYS = "ALWAYS"  # whatever its dependencies did


class Expiry(StrEnum):
    """What a step waiting for a signal does when its timeout passes without the signal."""

    FAIL = "FAIL"  # the step fails for good (SignalTimedOut): before the pivot the saga turns back
    GO_ON = "GO_ON"  # the step succeeds without an output: its dependents run without the signal's data


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often and how fast a step (or its compensation) is tried again after a failure or timeout."""

    max_attempts: int | None = 3  # None: no limit
    initial_backoff_ms: int = 200
    multiplier: float = 2.0
    max_backoff_ms: int = 10_000
    jitter: float = 0.1  # fraction of the delay, spread both ways
    non_retryable_errors: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise DefinitionError(f"max_attempts must be >= 1 or None, got {self.max_attempts}")
        if self.initial_backoff_ms < 0 or self.max_backoff_ms < self.initial_backoff_ms:
            raise DefinitionError(
                f"need 0 <= initial_backoff_ms <= max_backoff_ms, got "
                f"{self.initial_backoff_ms} and {self.max_backoff_ms}"
            )
        if self.multiplier < 1:
            raise DefinitionError(f"multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise DefinitionError(f"jitter must be within [0, 1], got {self.jitter}")
        object.__setattr__(self, "non_retryable_errors", frozenset(self.non_retryable_errors))

    def allows_attempt(self, attempt: int) -> bool:
        """True when attempt number ``attempt`` (from 1) may still be sent."""
        return self.max_attempts is None or attempt <= self.max_attempts

    def should_retry(self, failed_attempt: int, retryable: bool, error_type: str | None) -> bool:
        """True when a failed attempt is worth another one under this policy."""
        return (
            retryable
            and error_type not in self.non_retryable_errors
            and self.allows_attempt(failed_attempt + 1)
        )

    def backoff_ms(self, failed_attempt: int, jitter_seed: str) -> int:
        """Delay before the attempt after ``failed_attempt``: exponential, capped, deterministic jitter.

        The jitter comes from a CRC of ``jitter_seed`` instead of a random generator so that deciding stays a
        pure function: replaying a history decides the very same due times.
        """
        try:
            base = min(
                float(self.max_backoff_ms), self.initial_backoff_ms * self.multiplier ** (failed_attempt - 1)
            )
        except OverflowError:
            base = float(self.max_backoff_ms)
        unit = zlib.crc32(jitter_seed.encode()) / 0xFFFFFFFF  # in [0, 1]
        delay = base * (1 + self.jitter * (2 * unit - 1))
        return max(0, min(self.max_backoff_ms, round(delay)))


UNLIMITED_RETRY = RetryPolicy(max_attempts=None)


@dataclass(frozen=True, kw_only=True)
class Step:
    """One step: a command sent to a participant, optionally undone by a compensation."""

    name: str
    participant: str
    command: str
    compensation: str | None = None
    depends_on: tuple[str, ...] = ()
    retry: RetryPolicy = RetryPolicy()
    compensation_retry: RetryPolicy = UNLIMITED_RETRY  # undoing must not give up silently
    timeout_ms: int = 5_000
    compensation_timeout_ms: int = 5_000
    pivot: bool = False
    run_if: Condition = Condition.ON_SUCCESS
    skippable: bool = False  # an operator may skip it (the Skip lever) when it is stuck: its dependents go on
    # A step that waits for a signal instead of sending a command (participant and command empty): it succeeds
    # with the signal's payload as its output, or after ``timeout_ms`` does as ``on_expiry`` says.
    signal: str | None = None
    on_expiry: Expiry = Expiry.FAIL
    # A step added in place while sagas of its version run, behind the marker of this name: a saga that reaches
    # it records that it took the patched path (PatchTaken); one that went past it before the change goes on
    # without it (the step is skipped as the saga passed it). See ``SagaDefinition.patches``.
    patch: str | None = None

    @property
    def waits(self) -> bool:
        """True for a step that waits for a signal (nothing is sent to a participant)."""
        return self.signal is not None

    def __post_init__(self) -> None:
        object.__setattr__(self, "depends_on", tuple(self.depends_on))
        if self.signal is not None:
            self._check_wait()
        if self.patch is not None and (not self.patch or ":" in self.patch):
            raise DefinitionError(f"step {self.name!r}: a patch marker's name must be non-empty and free of ':', "
                                  f"got {self.patch!r}")
        if self.pivot and self.patch is not None:
            raise DefinitionError(f"step {self.name!r}: the pivot cannot be added behind a patch marker (moving the "
                                  "pivot needs a new version)")
        if self.pivot and self.skippable:
            raise DefinitionError(f"step {self.name!r}: a pivot cannot be skippable (the saga passes its pivot "
                                  "only by the pivot succeeding)")
        # ':' separates the parts of idempotency keys and timer ids; a step name containing it could make
        # two different keys equal ("a:compensate" vs the compensation of "a").
        if not self.name or ":" in self.name:
            raise DefinitionError(f"step name must be non-empty and free of ':', got {self.name!r}")
        if self.signal is None and (not self.participant or not self.command):
            raise DefinitionError(f"step {self.name!r} needs a participant and a command")
        if self.timeout_ms <= 0 or self.compensation_timeout_ms <= 0:
            raise DefinitionError(f"step {self.name!r}: timeouts must be positive")

    def _check_wait(self) -> None:
        if not self.signal:
            raise DefinitionError(f"step {self.name!r}: the signal it waits for needs a name")
        if self.participant or self.command or self.compensation is not None:
            raise DefinitionError(f"step {self.name!r} waits for signal {self.signal!r}: it sends no command "
                                  "and has nothing to undo (no participant, command or compensation)")
        if self.pivot:
            raise DefinitionError(f"step {self.name!r} waits for signal {self.signal!r}: a wait cannot be the pivot")


@dataclass(frozen=True, kw_only=True)
class SagaDefinition:
    """A saga type at one version: its steps (a DAG) and what to do when one fails."""

    saga_type: str
    version: int
    steps: tuple[Step, ...]
    input_schema: str  # Avro full name of the input record, e.g. "saga.v1.trip.TripRequest"
    failure_mode: FailureMode = FailureMode.FAIL_FAST
    compensate_on_continue: bool = False
    # Time from the start within which the saga must pass its pivot (or end, without one); when it runs out
    # the saga is cancelled as if a CancelSaga had come. None: no deadline.
    deadline_ms: int | None = None
    # Input fields (top-level, of a primitive type) every saga of this type is findable by: a customer id, an
    # order number. Indexed when a saga starts (saga.search_keys); the console and the HTTP API search them.
    searchable: tuple[str, ...] = ()
    # The signals its sagas accept: (name, Avro full name of the record a SignalSaga of that name carries).
    signals: tuple[tuple[str, str], ...] = ()

    order: tuple[str, ...] = field(init=False, repr=False, compare=False)  # topological, stable
    fingerprint: str = field(init=False, repr=False, compare=False)  # of its shape: see ``shape``
    # Every shape a running saga of this version may have recorded: the fingerprint of each, with the patch
    # markers that shape lacks (the full shape lacks none). See ``patches``.
    shapes: Mapping[str, frozenset[str]] = field(init=False, repr=False, compare=False)
    _by_name: Mapping[str, Step] = field(init=False, repr=False, compare=False)
    _upstream: Mapping[str, frozenset[str]] = field(init=False, repr=False, compare=False)
    _downstream: Mapping[str, frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "signals", tuple((name, record) for name, record in self.signals))
        where = f"saga {self.saga_type!r} v{self.version}"
        if not self.saga_type:
            raise DefinitionError("saga_type must be non-empty")
        if self.version < 1:
            raise DefinitionError(f"{where}: version must be >= 1")
        if not self.steps:
            raise DefinitionError(f"{where}: a saga needs at least one step")
        if self.deadline_ms is not None and self.deadline_ms <= 0:
            raise DefinitionError(f"{where}: deadline_ms must be positive (or None for no deadline)")
        by_name: dict[str, Step] = {}
        for step in self.steps:
            if step.name in by_name:
                raise DefinitionError(f"{where}: duplicate step name {step.name!r}")
            by_name[step.name] = step
        for step in self.steps:
            for dep in step.depends_on:
                if dep not in by_name:
                    raise DefinitionError(f"{where}: step {step.name!r} depends on unknown step {dep!r}")
        order = _topological_order(self.steps, where)
        upstream: dict[str, frozenset[str]] = {}
        for name in order:
            deps = by_name[name].depends_on
            upstream[name] = frozenset(deps).union(*(upstream[d] for d in deps))
        downstream = {name: frozenset(o for o in order if name in upstream[o]) for name in order}
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_upstream", upstream)
        object.__setattr__(self, "_downstream", downstream)
        self._check_modes(where)
        self._check_pivot(where)
        self._check_signals(where)
        self._check_patches(where)
        patches = self.patches
        shapes = {_fingerprint_of(self.shape(frozenset(lacking))): frozenset(lacking)
                  for size in range(len(patches) + 1) for lacking in itertools.combinations(patches, size)}
        object.__setattr__(self, "fingerprint", _fingerprint_of(self.shape()))
        object.__setattr__(self, "shapes", shapes)

    @property
    def patches(self) -> tuple[str, ...]:
        """The patch markers its steps are added behind, sorted. A patch adds steps in place, without a new version,
        while sagas of this version run: each saga decides for itself at the point where the patch's steps would
        first become ready. One that reaches that point takes the patched path and records so (``PatchTaken``,
        carrying the fingerprint of its shape from then on); one that went past it (a step after the patch's steps
        was sent) keeps its path: the patch's steps are skipped for it, counting as done for its dependents. A saga
        started on the full shape needs no record. Each shape without some of the patches is a shape of this
        version (``shapes``): the deploy check, ``fold`` and the replay check accept it."""
        return tuple(sorted({step.patch for step in self.steps if step.patch is not None}))

    def patch_steps(self, patch: str) -> tuple[str, ...]:
        """The steps added behind ``patch``, in topological order."""
        return tuple(name for name in self.order if self._by_name[name].patch == patch)

    def patch_followers(self, patch: str) -> tuple[str, ...]:
        """The steps outside ``patch`` that depend directly on one of its steps: a saga that sent one of them
        before the patch was deployed went past the point."""
        added = set(self.patch_steps(patch))
        return tuple(name for name in self.order
                     if name not in added and added.intersection(self._by_name[name].depends_on))

    def lacking(self, fingerprint: str | None) -> frozenset[str] | None:
        """The patches the shape of ``fingerprint`` lacks: empty for the full shape, every patch for a saga that
        recorded no fingerprint (it started before patches could be recorded), None for a shape this version does
        not have."""
        if fingerprint is None:
            return frozenset(self.patches)
        return self.shapes.get(fingerprint)

    def shape_fingerprint(self, lacking: frozenset[str]) -> str:
        """The fingerprint of this version's shape without the patches in ``lacking``."""
        return next(fp for fp, missing in self.shapes.items() if missing == lacking)

    def shape(self, lacking: frozenset[str] = frozenset()) -> dict[str, Any]:
        """What decides a running saga's path, as plain data: each step's name, participant, command, undo,
        dependencies, pivot, condition and signal wait (with what its expiry does), the failure mode, whether
        a deadline applies, and the signals with their records. Not in it, so safe to change under running
        sagas: retry policies, timeouts, the deadline's length, ``skippable``, ``searchable``, the input
        schema's name and the order steps are declared in. ``fingerprint`` is a hash of it: a saga records the
        fingerprint of the shape it started on and is only ever decided by that shape.

        ``lacking``: the shape without the steps of those patch markers, each step that followed one of them
        depending on what the patch's steps depended on instead; that is the shape the definition had before the
        patches were added. A marker's name is not part of the shape: removing a marker keeps the full shape."""
        removed = {step.name for step in self.steps if step.patch is not None and step.patch in lacking}

        def depends_on(step: Step) -> list[str]:
            deps: set[str] = set()
            todo = list(step.depends_on)
            while todo:
                dep = todo.pop()
                if dep in removed:
                    todo.extend(self._by_name[dep].depends_on)
                else:
                    deps.add(dep)
            return sorted(deps)

        return {
            "failure_mode": self.failure_mode.value,
            "compensate_on_continue": self.compensate_on_continue,
            "deadline": self.deadline_ms is not None,
            "signals": sorted([name, record] for name, record in self.signals),
            "steps": {step.name: {
                "participant": step.participant, "command": step.command, "compensation": step.compensation,
                "depends_on": depends_on(step), "pivot": step.pivot, "run_if": step.run_if.value,
                "signal": step.signal, "on_expiry": step.on_expiry.value if step.signal is not None else None,
            } for step in self.steps if step.name not in removed},
        }

    def _check_patches(self, where: str) -> None:
        patches = self.patches
        if len(patches) > MAX_PATCHES:
            raise DefinitionError(f"{where}: {len(patches)} patch markers, at most {MAX_PATCHES}: remove the markers "
                                  "whose old path no running saga can take any more (saga definitions check --patch)")
        for patch in patches:
            if not self.patch_followers(patch):
                raise DefinitionError(
                    f"{where}: no step follows the steps of patch {patch!r} ({', '.join(self.patch_steps(patch))}); "
                    "a saga's path reaches a patch where a step after it would run, so a patch adds steps before "
                    "others: a step added at the end needs no marker or a new version")

    def _check_signals(self, where: str) -> None:
        names = [name for name, _ in self.signals]
        if len(set(names)) != len(names):
            raise DefinitionError(f"{where}: a signal is declared twice in {names}")
        for step in self.steps:
            if step.signal is not None and step.signal not in names:
                raise DefinitionError(f"{where}: step {step.name!r} waits for signal {step.signal!r}, which the saga "
                                      f"does not declare (declared: {', '.join(names) or 'none'})")

    def signal_record(self, name: str) -> str | None:
        """The Avro full name of the record signal ``name`` carries; None when the saga declares no such signal."""
        return next((record for signal, record in self.signals if signal == name), None)

    def _check_modes(self, where: str) -> None:
        if self.compensate_on_continue and self.failure_mode is not FailureMode.CONTINUE:
            raise DefinitionError(f"{where}: compensate_on_continue needs failure_mode CONTINUE")
        for step in self.steps:
            if step.run_if is Condition.ON_FAILURE:
                if self.failure_mode is not FailureMode.CONTINUE:
                    raise DefinitionError(
                        f"{where}: step {step.name!r} runs ON_FAILURE, which needs failure_mode CONTINUE"
                    )
                if not step.depends_on:
                    raise DefinitionError(
                        f"{where}: ON_FAILURE step {step.name!r} must depend on the steps whose "
                        "failure it handles"
                    )

    def _check_pivot(self, where: str) -> None:
        pivots = [s.name for s in self.steps if s.pivot]
        if len(pivots) > 1:
            raise DefinitionError(f"{where}: at most one pivot step, got {', '.join(pivots)}")
        if not pivots:
            return
        pivot = self._by_name[pivots[0]]
        if pivot.run_if is not Condition.ON_SUCCESS:
            raise DefinitionError(f"{where}: pivot step {pivot.name!r} must run ON_SUCCESS")
        for step in self.steps:
            if step.name == pivot.name or step.name in self._upstream[pivot.name]:
                continue
            if step.name not in self._downstream[pivot.name]:
                raise DefinitionError(
                    f"{where}: step {step.name!r} is neither before nor after pivot {pivot.name!r}; "
                    "every step must be ordered with the pivot"
                )
            if step.retry.max_attempts is not None:
                raise DefinitionError(
                    f"{where}: step {step.name!r} runs after pivot {pivot.name!r} and must retry without "
                    "limit (retry.max_attempts=None): after the pivot the saga only moves forward"
                )

    def step(self, name: str) -> Step:
        """The step called ``name``; KeyError if there is none."""
        return self._by_name[name]

    def has_step(self, name: str) -> bool:
        """True when the definition has a step called ``name``."""
        return name in self._by_name

    def upstream(self, name: str) -> frozenset[str]:
        """Every step ``name`` depends on, directly or transitively."""
        return self._upstream[name]

    def downstream(self, name: str) -> frozenset[str]:
        """Every step that depends on ``name``, directly or transitively."""
        return self._downstream[name]

    @property
    def pivot(self) -> Step | None:
        """The pivot step, if the saga has one."""
        return next((s for s in self.steps if s.pivot), None)


MAX_PATCHES = 6
"""Patch markers one version may carry at once (each doubles the shapes its running sagas may have)."""


def _fingerprint_of(shape: Mapping[str, Any]) -> str:
    canonical = json.dumps(shape, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _topological_order(steps: Sequence[Step], where: str) -> tuple[str, ...]:
    """Kahn's algorithm, taking ready steps in declaration order so the order is stable."""
    remaining = {s.name: set(s.depends_on) for s in steps}
    order: list[str] = []
    while remaining:
        ready = [s.name for s in steps if s.name in remaining and not remaining[s.name]]
        if not ready:
            raise DefinitionError(f"{where}: dependency cycle {_find_cycle(remaining)}")
        for name in ready:
            del remaining[name]
            order.append(name)
        for deps in remaining.values():
            deps.difference_update(ready)
    return tuple(order)


def _find_cycle(remaining: Mapping[str, set[str]]) -> str:
    """A readable cycle among steps that never became ready (each has a dependency among them)."""
    start = min(remaining)
    path = [start]
    while True:
        nxt = min(remaining[path[-1]])
        if nxt in path:
            cycle = [*path[path.index(nxt) :], nxt]
            return " -> ".join(cycle)
        path.append(nxt)


class DefinitionRegistry:
    """Definitions by saga type and version; new sagas start on the latest version of their type."""

    def __init__(self, definitions: Iterable[SagaDefinition] = ()) -> None:
        self._definitions: dict[tuple[str, int], SagaDefinition] = {}
        self._draining: set[tuple[str, int]] = set()
        for definition in definitions:
            self.register(definition)

    def drain(self, saga_type: str, version: int) -> None:
        """Take no new starts on ``saga_type`` at ``version``: ``latest`` passes it over, while the sagas already
        on it go on to their end. UnknownDefinition when it is not registered."""
        self.get(saga_type, version)
        self._draining.add((saga_type, version))

    def draining(self, saga_type: str) -> tuple[int, ...]:
        """The versions of ``saga_type`` that take no new starts, ascending."""
        return tuple(sorted(v for t, v in self._draining if t == saga_type))

    def register(self, definition: SagaDefinition) -> None:
        """Add a definition; registering a different one under a taken (type, version) is an error."""
        key = (definition.saga_type, definition.version)
        existing = self._definitions.get(key)
        if existing is not None and existing != definition:
            raise DefinitionError(
                f"saga {definition.saga_type!r} v{definition.version} is already registered with other "
                "steps; publish a new version instead of changing one that sagas may be running on"
            )
        self._definitions[key] = definition

    def latest(self, saga_type: str) -> SagaDefinition | None:
        """The version a new saga of ``saga_type`` starts on: the highest one not draining; None when the type is
        unknown or every version of it drains."""
        versions = [v for v in self.versions(saga_type) if (saga_type, v) not in self._draining]
        return self._definitions[(saga_type, versions[-1])] if versions else None

    def get(self, saga_type: str, version: int) -> SagaDefinition:
        """Exactly ``saga_type`` at ``version``; UnknownDefinition if it is not registered."""
        try:
            return self._definitions[(saga_type, version)]
        except KeyError:
            known = ", ".join(f"{t} v{v}" for t, v in sorted(self._definitions)) or "none"
            raise UnknownDefinition(
                f"no definition for saga type {saga_type!r} version {version} (registered: {known})"
            ) from None

    def versions(self, saga_type: str) -> tuple[int, ...]:
        """Registered versions of ``saga_type``, ascending."""
        return tuple(sorted(v for t, v in self._definitions if t == saga_type))

    def definitions(self) -> list[SagaDefinition]:
        """Every registered definition, by type and version."""
        return [self._definitions[key] for key in sorted(self._definitions)]

    def types(self) -> tuple[str, ...]:
        """Registered saga types, sorted."""
        return tuple(sorted({t for t, _ in self._definitions}))

    def for_history(self, events: Sequence[Event]) -> SagaDefinition | None:
        """The definition a recorded saga runs on, read from its SagaStarted event, or from its last SagaMigrated
        when an operator moved it to another version.

        None for an empty history or one that never started (only SagaRejected).
        """
        started = next((e for e in events if isinstance(e, SagaStarted)), None)
        if started is None:
            return None
        migrated = next((e for e in reversed(events) if isinstance(e, SagaMigrated)), None)
        return self.get(started.saga_type, started.definition_version if migrated is None else migrated.to_version)
