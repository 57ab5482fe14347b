"""What a change to a saga definition means for the sagas of that type already running.

A running saga records the fingerprint of the shape it started on (``SagaDefinition.shape``), so every
difference between two definitions of one saga type is either policy, outside the shape, or a change of shape
that running sagas either can or cannot follow. ``diff`` lists each difference with its verdict; ``diff_shapes``
does the shape part from two ``shape()`` dicts alone (a stored shape, read back from JSON, is all there is of a
definition no longer deployed).

=================================================== ======= ===================================================
Change                                              Verdict Why
=================================================== ======= ===================================================
retry policy or timeout (of a step or of its undo), SAFE    read when a timer is armed, an operator acts or a
the deadline's length, ``skippable``,                       saga starts; no recorded event depends on what they
``searchable``, the input schema's name, the                were, and dependencies, not the declaration, order
declaration order                                           the steps
a step added: before the pivot, after it, after     PATCH   a saga that has not reached where it goes would run
everything, or as a new branch (ON_FAILURE, ALWAYS)         it; one that has must keep its path
an existing step now also after new steps (and      PATCH   that is how a step is inserted: the step waits for
still after every step it followed)                         what it waited for, and for the new one
a new signal declared                               PATCH   a saga would accept a signal it used to refuse
a step removed or renamed                           VERSION events name it; its idempotency keys derive from
                                                            its name
a step's participant, command or undo changed, an   VERSION a retry or an undo under way would go elsewhere;
undo added or removed                                       having an undo decides how a step's outcomes fold
                                                            and what an unwinding waits for
an existing step's dependencies changed otherwise   VERSION sagas ran it, or wait for it, under the old ones
the pivot moved, added or removed                   VERSION past the pivot a saga only moves forward; before
                                                            it, it may still turn back
a condition of an existing step changed             VERSION sagas that settled it would have settled it
                                                            otherwise
the failure mode or ``compensate_on_continue``      VERSION a saga that failed a step already took the other
                                                            road
a deadline added or removed                         VERSION its timer is armed from the start: sagas would
                                                            lack one, or hold one that means nothing
a signal removed or its record changed              VERSION recorded signals carry the old record; a wait
                                                            for it could never be answered
a wait's signal or ``on_expiry`` changed            VERSION a wait under way ends as it began
=================================================== ======= ===================================================

A change of shape made behind patch markers (``Step.patch``: the old shape is the new version's shape without
those patches) is SAFE: each running saga takes the patch or keeps its path, by where it stands.

The saga type and version are not compared: two versions of one type with the same shape and policy differ in
nothing. Every difference of shape gets PATCH or VERSION, unless made behind patch markers, and every
difference of policy SAFE, so a SAFE-only diff keeps the fingerprint or adds steps behind markers, and any
other diff changes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .definition import RetryPolicy, SagaDefinition, Step
from .errors import DefinitionError


class Verdict(StrEnum):
    """What a change means for sagas already running, from harmless to impossible in place."""

    SAFE = "safe for running sagas"
    PATCH = "needs a patch marker"
    VERSION = "needs a new version"


_SEVERITY = {Verdict.SAFE: 0, Verdict.PATCH: 1, Verdict.VERSION: 2}


@dataclass(frozen=True)
class Change:
    """One difference between two definitions of a saga type."""

    step: str | None  # the step it is about (its old name when renamed); None for the saga as a whole
    what: str  # one line a person reads, naming the step(s)
    verdict: Verdict


def verdict(changes: Sequence[Change]) -> Verdict:
    """The worst verdict among ``changes``; SAFE when there are none."""
    return max((change.verdict for change in changes), key=_SEVERITY.__getitem__, default=Verdict.SAFE)


def diff(old: SagaDefinition, new: SagaDefinition) -> list[Change]:
    """Every change from ``old`` to ``new``, two definitions of one saga type (their versions may differ): the
    changes of shape (``diff_shapes``) and of policy (SAFE), saga-level first, then by step name, each group in
    a fixed order. Empty when they are equal in shape and policy. DefinitionError for two saga types."""
    if old.saga_type != new.saga_type:
        raise DefinitionError(f"cannot compare saga {old.saga_type!r} with saga {new.saga_type!r}")
    shape_changes = diff_shapes(old.shape(), new.shape())
    behind = new.lacking(old.fingerprint)
    if behind:  # old's shape is new's without these patches: every change of shape is made behind them
        markers = ", ".join(repr(patch) for patch in sorted(behind))
        shape_changes = [Change(change.step, f"{change.what}, behind patch {markers}", Verdict.SAFE)
                         for change in shape_changes]
    return _ordered([*shape_changes, *_policy_changes(old, new)])


def diff_shapes(old_shape: Mapping[str, Any], new_shape: Mapping[str, Any]) -> list[Change]:
    """The changes of shape between two ``SagaDefinition.shape()`` dicts (or their JSON read back), in the order
    ``diff`` gives them; never a SAFE one. Non-empty exactly when the shapes differ: a key this module does not
    know (a shape of another format) that differs is a VERSION change."""
    old_steps: Mapping[str, Mapping[str, Any]] = old_shape.get("steps", {})
    new_steps: Mapping[str, Mapping[str, Any]] = new_shape.get("steps", {})
    renamed = _renames(old_steps, new_steps)
    added = set(new_steps) - set(old_steps) - set(renamed.values())
    changes = [*_saga_changes(old_shape, new_shape), *_pivot_changes(old_steps, new_steps),
               *_signal_changes(old_shape, new_shape)]
    old_upstream, new_upstream = _upstream(old_steps), _upstream(new_steps)
    new_pivot = _pivot(new_steps)
    for name in sorted((set(old_steps) | set(new_steps)) - set(renamed.values())):
        if name in renamed:
            changes.append(Change(name, f"step {name!r} renamed to {renamed[name]!r}", Verdict.VERSION))
        elif name not in new_steps:
            changes.append(Change(name, f"step {name!r} removed", Verdict.VERSION))
        elif name in added:
            changes.append(_added(name, new_steps[name], new_pivot, new_upstream))
        else:
            before, after = old_upstream[name], new_upstream[name]
            inserted_only = before < after and after - before <= added
            changes.extend(_step_changes(name, old_steps[name], new_steps[name], inserted_only))
    return _ordered(changes)


def _ordered(changes: Iterable[Change]) -> list[Change]:
    # sorted() is stable: within the saga and within a step, the order the checks run in stays.
    return sorted(changes, key=lambda change: (change.step is not None, change.step or ""))


_SAGA_KEYS = {"failure_mode", "compensate_on_continue", "deadline", "signals", "steps"}
_STEP_KEYS = {"participant", "command", "compensation", "depends_on", "pivot", "run_if", "signal", "on_expiry"}


def _saga_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    changes: list[Change] = []
    if old.get("failure_mode") != new.get("failure_mode"):
        changes.append(Change(None, f"failure mode changed from {old.get('failure_mode')} to "
                                    f"{new.get('failure_mode')}", Verdict.VERSION))
    if bool(old.get("compensate_on_continue")) != bool(new.get("compensate_on_continue")):
        now = "now" if new.get("compensate_on_continue") else "no longer"
        changes.append(Change(None, f"a CONTINUE saga {now} compensates (compensate_on_continue)", Verdict.VERSION))
    if bool(old.get("deadline")) != bool(new.get("deadline")):
        what = "a deadline added" if new.get("deadline") else "the deadline removed"
        changes.append(Change(None, what, Verdict.VERSION))
    for key in sorted((set(old) | set(new)) - _SAGA_KEYS):
        if old.get(key) != new.get(key):
            changes.append(Change(None, f"{key!r} of the saga changed from {old.get(key)!r} to {new.get(key)!r}",
                                  Verdict.VERSION))
    return changes


def _pivot_changes(old_steps: Mapping[str, Mapping[str, Any]],
                   new_steps: Mapping[str, Mapping[str, Any]]) -> list[Change]:
    old, new = _pivot(old_steps), _pivot(new_steps)
    if old == new:
        return []
    if old is None:
        what = f"pivot {new!r} added (the saga had none)"
    elif new is None:
        what = f"pivot {old!r} removed (the saga has none now)"
    else:
        what = f"pivot moved from {old!r} to {new!r}"
    return [Change(None, what, Verdict.VERSION)]


def _signal_changes(old_shape: Mapping[str, Any], new_shape: Mapping[str, Any]) -> list[Change]:
    old = {name: record for name, record in old_shape.get("signals", [])}
    new = {name: record for name, record in new_shape.get("signals", [])}
    changes: list[Change] = []
    for name in sorted(set(old) | set(new)):
        if name not in old:
            changes.append(Change(None, f"signal {name!r} declared (carries {new[name]})", Verdict.PATCH))
        elif name not in new:
            changes.append(Change(None, f"signal {name!r} removed (carried {old[name]})", Verdict.VERSION))
        elif old[name] != new[name]:
            changes.append(Change(None, f"signal {name!r} now carries {new[name]} (was {old[name]})",
                                  Verdict.VERSION))
    return changes


def _added(name: str, step: Mapping[str, Any], pivot: str | None, upstream: Mapping[str, frozenset[str]]) -> Change:
    if pivot is None or name == pivot:
        where = ""  # a new pivot is a pivot change too, reported for the saga
    elif name in upstream[pivot]:
        where = f" before pivot {pivot!r}"
    else:
        where = f" after pivot {pivot!r}"
    branch = f", a branch that runs {step.get('run_if')}" if step.get("run_if") != "ON_SUCCESS" else ""
    wait = f", waiting for signal {step.get('signal')!r}" if step.get("signal") is not None else ""
    return Change(name, f"step {name!r} added{where}{branch}{wait} (depends on {_names(step.get('depends_on'))})",
                  Verdict.PATCH)


def _step_changes(name: str, old: Mapping[str, Any], new: Mapping[str, Any], inserted_only: bool) -> list[Change]:
    """The changes of one step present in both shapes. ``inserted_only``: it follows every step it followed
    before and, besides, new steps only, so a change of its dependencies is the insertion of those steps."""
    changes: list[Change] = []

    def changed(key: str, what: str, verdict: Verdict = Verdict.VERSION) -> None:
        if old.get(key) != new.get(key):
            changes.append(Change(name, what, verdict))

    changed("participant", f"participant of step {name!r} changed from {_text(old.get('participant'))} to "
                           f"{_text(new.get('participant'))}")
    changed("command", f"command of step {name!r} changed from {_text(old.get('command'))} to "
                       f"{_text(new.get('command'))}")
    if old.get("compensation") is None:
        changed("compensation", f"step {name!r} is now undone by {new.get('compensation')!r} (it had no undo)")
    elif new.get("compensation") is None:
        changed("compensation", f"step {name!r} no longer has an undo (was {old.get('compensation')!r})")
    else:
        changed("compensation", f"undo of step {name!r} changed from {old.get('compensation')!r} to "
                                f"{new.get('compensation')!r}")
    if old.get("signal") is None:
        changed("signal", f"step {name!r} now waits for signal {new.get('signal')!r}")
    elif new.get("signal") is None:
        changed("signal", f"step {name!r} no longer waits for signal {old.get('signal')!r}")
    else:
        changed("signal", f"step {name!r} now waits for signal {new.get('signal')!r} (was {old.get('signal')!r})")
    if old.get("signal") is not None and new.get("signal") is not None:  # else the signal change says it all
        changed("on_expiry", f"on_expiry of wait {name!r} changed from {old.get('on_expiry')} to "
                             f"{new.get('on_expiry')}")
    changed("run_if", f"condition of step {name!r} changed from {old.get('run_if')} to {new.get('run_if')}")
    if sorted(old.get("depends_on") or []) != sorted(new.get("depends_on") or []):
        changes.append(Change(name, f"step {name!r} now depends on {_names(new.get('depends_on'))} "
                                    f"(was {_names(old.get('depends_on'))})",
                              Verdict.PATCH if inserted_only else Verdict.VERSION))
    for key in sorted((set(old) | set(new)) - _STEP_KEYS):
        changed(key, f"{key!r} of step {name!r} changed from {old.get(key)!r} to {new.get(key)!r}")
    return changes


def _renames(old_steps: Mapping[str, Mapping[str, Any]],
             new_steps: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Old name -> new name for a removed step and an added one alike in everything but the name (dependencies
    compared as they are written), when each has exactly one such counterpart."""
    removed = [name for name in sorted(old_steps) if name not in new_steps]
    added = [name for name in sorted(new_steps) if name not in old_steps]
    alike = {old: [new for new in added if _body(new_steps[new]) == _body(old_steps[old])] for old in removed}
    renames: dict[str, str] = {}
    for old, candidates in alike.items():
        if len(candidates) == 1 and sum(candidates[0] in others for others in alike.values()) == 1:
            renames[old] = candidates[0]
    return renames


def _body(step: Mapping[str, Any]) -> dict[str, Any]:
    return {**step, "depends_on": sorted(step.get("depends_on") or [])}


def _pivot(steps: Mapping[str, Mapping[str, Any]]) -> str | None:
    return next((name for name in sorted(steps) if steps[name].get("pivot")), None)


def _upstream(steps: Mapping[str, Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """Every step each step depends on, directly or not (a dependency on a step the shape lacks is kept)."""
    upstream: dict[str, frozenset[str]] = {}
    for name in steps:
        seen: set[str] = set()
        todo = list(steps[name].get("depends_on") or [])
        while todo:
            dep = todo.pop()
            if dep not in seen:
                seen.add(dep)
                todo.extend((steps[dep].get("depends_on") or []) if dep in steps else [])
        upstream[name] = frozenset(seen)
    return upstream


def _names(names: Iterable[str] | None) -> str:
    return ", ".join(sorted(names or [])) or "nothing"


def _text(value: object) -> str:
    return repr(value) if value else "none"


def _policy_changes(old: SagaDefinition, new: SagaDefinition) -> list[Change]:
    """The SAFE changes: what ``shape`` leaves out, for the saga and for each step in both."""
    changes: list[Change] = []
    if old.deadline_ms is not None and new.deadline_ms is not None and old.deadline_ms != new.deadline_ms:
        changes.append(Change(None, f"deadline changed from {old.deadline_ms} ms to {new.deadline_ms} ms",
                              Verdict.SAFE))
    if old.input_schema != new.input_schema:
        changes.append(Change(None, f"input schema changed from {old.input_schema} to {new.input_schema}",
                              Verdict.SAFE))
    if old.searchable != new.searchable:
        changes.append(Change(None, f"searchable fields changed to {', '.join(new.searchable) or 'none'} "
                                    f"(were {', '.join(old.searchable) or 'none'})", Verdict.SAFE))
    kept = [step.name for step in old.steps if new.has_step(step.name)]
    if kept != [step.name for step in new.steps if old.has_step(step.name)]:
        changes.append(Change(None, "steps declared in another order", Verdict.SAFE))
    for step in old.steps:
        if new.has_step(step.name):
            changes.extend(_step_policy_changes(step, new.step(step.name)))
    return changes


def _step_policy_changes(old: Step, new: Step) -> list[Change]:
    name = old.name
    changes: list[Change] = []
    if old.retry != new.retry:
        changes.append(Change(name, f"retry policy of step {name!r} changed{_policy_detail(old.retry, new.retry)}",
                              Verdict.SAFE))
    if old.timeout_ms != new.timeout_ms:
        changes.append(Change(name, f"timeout of step {name!r} changed from {old.timeout_ms} ms to "
                                    f"{new.timeout_ms} ms", Verdict.SAFE))
    if old.compensation_retry != new.compensation_retry:
        detail = _policy_detail(old.compensation_retry, new.compensation_retry)
        changes.append(Change(name, f"undo retry policy of step {name!r} changed{detail}", Verdict.SAFE))
    if old.compensation_timeout_ms != new.compensation_timeout_ms:
        changes.append(Change(name, f"undo timeout of step {name!r} changed from {old.compensation_timeout_ms} ms "
                                    f"to {new.compensation_timeout_ms} ms", Verdict.SAFE))
    if old.skippable != new.skippable:
        now = "now" if new.skippable else "no longer"
        changes.append(Change(name, f"step {name!r} is {now} skippable", Verdict.SAFE))
    return changes


def _policy_detail(old: RetryPolicy, new: RetryPolicy) -> str:
    fields = ("max_attempts", "initial_backoff_ms", "multiplier", "max_backoff_ms", "jitter", "non_retryable_errors")
    parts = []
    for field in fields:
        before, after = getattr(old, field), getattr(new, field)
        if before != after:
            if isinstance(before, frozenset):
                before, after = sorted(before), sorted(after)
            parts.append(f"{field} {before} -> {after}")
    return f" ({'; '.join(parts)})" if parts else ""
