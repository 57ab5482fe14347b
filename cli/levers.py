"""``saga cancel``, ``resume``, ``release`` and the levers (``saga retry-now``, ``skip``, ``force-compensate``,
``terminate``, ``pause``, ``unpause``, ``redrive``): one command per row of ``ACTION_RULES``, made by ``command``.

The row says whether the command takes a STEP and whether ``--reason`` is required, and gives its help; the
command builds its control command with ``lever_command`` and publishes it on saga.control. What the command
line adds is here: which status a saga must have before it is worth publishing (``--force`` skips that look),
and ``resume --wait``. Every command records who: ``--operator``, or the login name when it is not given."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import typer

from ..orchestrator.domain.model import RESUME_COMPENSATION
from ..orchestrator.domain.state import SagaStatus
from ..schemas import wire
from ..schemas.event_types import SagaCompensated
from ..schemas.message_types import (
    ACTION_RULES,
    CANCEL,
    RELEASE,
    RESUME,
    SAGA_ACTIONS,
    Lever,
    LeverRefused,
    OperateSaga,
    action_name,
    lever_command,
)
from .commands import FORCE_HELP, check_quarantined, publish, status_of
from .context import OPERATOR_HELP, console, fail, operator_or_login, run, settings, topics
from .inspect_cmd import follow, load_events_of


def _not_ended(saga_id: str) -> None:
    if (status := status_of(saga_id)).is_terminal:
        fail(f"saga {saga_id!r} already ended {status.value}: there is nothing to cancel")


def _compensation_failed(saga_id: str) -> None:
    if (status := status_of(saga_id)) is not SagaStatus.COMPENSATION_FAILED:
        fail(f"saga {saga_id!r} is {status.value}: only a COMPENSATION_FAILED saga can be resumed")


def _failed(saga_id: str) -> None:
    if (status := status_of(saga_id)) is not SagaStatus.FAILED:
        fail(f"saga {saga_id!r} is {status.value}: only a FAILED saga can be re-driven")


CHECKS: dict[str, Callable[[str], None]] = {
    CANCEL: _not_ended, RESUME: _compensation_failed, RELEASE: check_quarantined, Lever.REDRIVE: _failed,
}
"""The look at the event store before publishing (exits with what to do), for the commands that take --force."""
DETAIL = frozenset({RESUME, RELEASE})
"""The commands whose reason is called ``--detail`` (what was fixed), as 0.1 named it."""


def command(action: str) -> Callable[..., None]:
    """The typer command of ``action`` (one of ``SAGA_ACTIONS``), its parameters and help from its row."""
    rule = ACTION_RULES[action]
    said = "detail" if action in DETAIL else "reason"
    params = [_param("saga_id", str, typer.Argument(..., help="The saga it acts on."))]
    if rule.on_step:
        params.append(_param("step", str, typer.Argument(..., help="The step it acts on.")))
    if rule.reason is not None:
        params.append(_param(said, str, typer.Option(..., f"--{said}", help=f"{rule.reason.capitalize()}; recorded.")))
    else:
        help_ = "What was fixed; recorded." if said == "detail" else "Why; recorded."
        params.append(_param(said, str | None, typer.Option(None, f"--{said}", help=help_)))
    params.append(_param("operator", str | None, typer.Option(None, "--operator", help=OPERATOR_HELP)))
    if action == RESUME:
        params.append(_param("wait", bool, typer.Option(
            False, "--wait", help="Print the events the resume brings until the saga ends again; exit 0 when it "
                                  "ended COMPENSATED, 1 when it was refused or ended otherwise.")))
    if action in CHECKS:
        params.append(_param("force", bool, typer.Option(False, "--force", help=FORCE_HELP)))

    def pull(**given: Any) -> None:
        _pull(action, given["saga_id"], given.get("step"), given[said], given["operator"],
              force=given.get("force", False), wait=given.get("wait", False))

    pull.__name__ = action_name(action)
    pull.__doc__ = (f"{rule.does[0].upper()}{rule.does[1:]}. Published on saga.control; the orchestrator records "
                    "it in the saga's history, or why it could not apply (`saga history`).")
    pull.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    pull.__annotations__ = {param.name: param.annotation for param in params}
    return pull


def _param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _pull(action: str, saga_id: str, step: str | None, reason: str | None, operator: str | None, *, force: bool,
          wait: bool) -> None:
    try:
        message = lever_command(action, saga_id, step, operator_or_login(operator), reason)
    except LeverRefused as error:
        fail(str(error))
    events = run(load_events_of(saga_id)) if wait else []
    if not force and action in CHECKS:
        CHECKS[action](saga_id)
    current = settings()
    run(publish(current, topics(current).control, saga_id, wire.encode_control(message), None))
    named = f"OperateSaga {action}{' ' + step if step else ''}" if isinstance(message, OperateSaga) else \
        type(message).__name__
    console.print(f"published {named} for [bold]{saga_id}[/]: `saga history {saga_id}` shows whether it applied")
    if wait:
        try:  # what the resume brings: the events after those it was decided on
            ended = run(follow(saga_id, after_seq=events[-1].seq if events else 0, lever=RESUME_COMPENSATION))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        console.print(f"saga [bold]{saga_id}[/] ended: {type(ended).__name__}")
        raise typer.Exit(0 if isinstance(ended, SagaCompensated) else 1)


def register(app: typer.Typer) -> None:
    """Add one command per action of ``SAGA_ACTIONS`` to ``app`` (``ForceCompensate`` → ``force-compensate``)."""
    for action in SAGA_ACTIONS:
        app.command(action_name(action, "-"))(command(action))
