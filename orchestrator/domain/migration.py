"""Whether a running saga can move to another version of its definition (the ``Migrate`` lever).

A migrated saga is folded and decided by the target version from its start on (its SagaMigrated names it), so
what the saga already did must read the same under the target: every step it sent, waited on or settled exists
there with the same participant, command, undo, signal and pivot mark; and what the target still has to run
must be able to run: no pending step of the target may come before a step the saga already sent, since its
dependents would then have gone ahead without it. Only a RUNNING saga moves (paused or not): one that is
unwinding follows the undos it started with, one that ended or is quarantined waits for nothing a new version
would change.
"""

from __future__ import annotations

from .definition import SagaDefinition, Step
from .model import SagaState, SagaStatus, StepStatus


def migration_problem(state: SagaState, source: SagaDefinition, target: SagaDefinition) -> str | None:
    """Why the saga in ``state``, running on ``source``, cannot move to ``target``, as one readable line naming
    the step at fault; None when it can."""
    if target.saga_type != source.saga_type or state.saga_type != target.saga_type:
        return f"v{target.version} is a definition of saga type {target.saga_type!r}, the saga is {state.saga_type!r}"
    if state.definition_version == target.version:
        return f"the saga already runs on {target.saga_type} v{target.version}"
    if state.status is not SagaStatus.RUNNING:
        return f"saga is {state.status}: only a RUNNING saga moves to another version"
    if target.failure_mode is not source.failure_mode:
        return (f"v{target.version} handles a failure otherwise ({target.failure_mode}, the saga runs "
                f"{source.failure_mode})")
    if (target.deadline_ms is None) != (source.deadline_ms is None):
        return (f"v{target.version} {'has a deadline' if target.deadline_ms is not None else 'has no deadline'}, "
                f"v{source.version} {'none' if source.deadline_ms is None else 'one'}: the saga's deadline was "
                "armed (or not) when it started")
    started = [name for name in source.order if state.steps[name].status is not StepStatus.PENDING]
    for name in started:
        status = state.steps[name].status
        if not target.has_step(name):
            return f"step {name} is {status} in the saga, and v{target.version} has no step {name}"
        if (difference := _difference(source.step(name), target.step(name))) is not None:
            return f"step {name} is {status} in the saga, and v{target.version} {difference}"
    for name in target.order:
        if name in started:
            continue
        ahead = sorted(target.downstream(name).intersection(started))
        if ahead:
            return (f"step {name} of v{target.version} would come before step {ahead[0]}, which the saga already "
                    f"ran: {name} would never run")
    return None


def _difference(ran: Step, target: Step) -> str | None:
    """What the target's step does otherwise than the step the saga ran, in words; None when nothing."""
    if (ran.participant, ran.command) != (target.participant, target.command):
        return f"sends {target.command!r} to {target.participant!r} instead of {ran.command!r} to {ran.participant!r}"
    if ran.compensation != target.compensation:
        return f"undoes it by {target.compensation!r} instead of {ran.compensation!r}"
    if ran.signal != target.signal:
        return f"waits for signal {target.signal!r} instead of {ran.signal!r}"
    if ran.pivot != target.pivot:
        return "makes it the pivot" if target.pivot else "does not make it the pivot"
    return None
