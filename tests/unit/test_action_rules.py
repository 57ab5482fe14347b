"""One table says what each operator action needs (``schemas.message_types.ACTION_RULES``); every face that
offers an action is checked against it here: the command line, the client, the test kit, the console and the
core's refusal."""

from __future__ import annotations

import inspect
import re

import pytest
import typer

from saga_orchestrator.cli.main import app as cli_app
from saga_orchestrator.client import SagaClient
from saga_orchestrator.client.levers import LeverMethods
from saga_orchestrator.console.operating import ActionRefused, Offer, message_for
from saga_orchestrator.schemas.message_types import (
    ACTION_RULES,
    SAGA_ACTIONS,
    ActionRule,
    Lever,
    LeverRefused,
    action_name,
    lever_command,
)
from saga_orchestrator.testing import SagaEnvironment

FACED = [ACTION_RULES[action] for action in SAGA_ACTIONS]


def _snake(action: str) -> str:
    return action_name(action)


def _required(function: object, name: str) -> bool | None:
    """Whether ``function`` requires parameter ``name`` (None: it has no such parameter)."""
    found = inspect.signature(function).parameters.get(name)  # type: ignore[arg-type]
    return None if found is None else found.default is inspect.Parameter.empty


@pytest.mark.parametrize("rule", FACED, ids=lambda rule: rule.action)
def test_the_command_line_asks_for_what_the_table_says(rule: ActionRule) -> None:
    commands = typer.main.get_command(cli_app).commands  # type: ignore[attr-defined]
    command = commands[_snake(rule.action).replace("_", "-")]
    params = {param.name: param for param in command.params}
    assert ("step" in params) == rule.on_step
    said = params.get("reason") or params.get("detail")
    assert said is not None
    assert said.required == (rule.reason is not None)


@pytest.mark.parametrize("rule", FACED, ids=lambda rule: rule.action)
def test_the_client_asks_for_what_the_table_says(rule: ActionRule) -> None:
    method = getattr(SagaClient, _snake(rule.action))
    assert (_required(method, "step") is True) == rule.on_step
    assert (_required(method, "reason") is True) == (rule.reason is not None)


@pytest.mark.parametrize("rule", FACED, ids=lambda rule: rule.action)
def test_the_test_kit_offers_every_action_with_a_reason_where_one_is_needed(rule: ActionRule) -> None:
    method = getattr(SagaEnvironment, _snake(rule.action))
    assert (_required(method, "step") is True) == rule.on_step
    if rule.reason is not None:  # required, or given by the kit itself (a cancel "in a test")
        assert _required(method, "reason") is not None


@pytest.mark.parametrize("rule", FACED, ids=lambda rule: rule.action)
def test_the_console_refuses_what_the_table_refuses_and_offers_a_reason_field_where_needed(rule: ActionRule) -> None:
    assert Offer(rule.action).needs_reason == (rule.reason is not None)
    step = "book_flight" if rule.on_step else None
    if rule.reason is not None:
        with pytest.raises(ActionRefused, match=rf"^{rule.action} needs a reason \({re.escape(rule.reason)}\)"):
            message_for("t-1", rule.action, step, "ana", " ")
    if rule.on_step:
        with pytest.raises(ActionRefused, match=rf"^{rule.action} needs the step it acts on"):
            message_for("t-1", rule.action, None, "ana", "because")
    message_for("t-1", rule.action, step, "ana", "because")


def test_every_lever_has_its_row() -> None:
    assert {lever.value for lever in Lever} <= set(ACTION_RULES)


def _public_coroutines(cls: type, *, beside: type | None = None) -> set[str]:
    return {name for name, member in vars(cls).items()
            if not name.startswith("_") and inspect.iscoroutinefunction(member)} - set(vars(beside or object))


LEVER_COMMANDS = {action_name(action, "-") for action in SAGA_ACTIONS}


def test_every_face_offers_exactly_the_tables_actions() -> None:
    """A new action is a row of the table (and the core's handling of it): no face lists actions of its own."""
    named = {action_name(action) for action in SAGA_ACTIONS}
    assert _public_coroutines(LeverMethods) - {"pull", "control"} == named
    assert issubclass(SagaClient, LeverMethods)
    kit = {name for name in named if inspect.iscoroutinefunction(getattr(SagaEnvironment, name, None))}
    assert kit == named
    commands = typer.main.get_command(cli_app).commands  # type: ignore[attr-defined]
    from saga_orchestrator.cli import levers
    assert {name for name, command in commands.items() if command.callback is not None
            and command.callback.__module__ == levers.__name__} == LEVER_COMMANDS


@pytest.mark.parametrize("rule", FACED, ids=lambda rule: rule.action)
def test_the_one_builder_refuses_what_the_table_refuses(rule: ActionRule) -> None:
    step = "book_flight" if rule.on_step else None
    if rule.reason is not None:
        with pytest.raises(LeverRefused, match=rf"^{rule.action} needs a reason"):
            lever_command(rule.action, "t-1", step, "ana", "  ")
    if rule.on_step:
        with pytest.raises(LeverRefused, match="needs the step it acts on"):
            lever_command(rule.action, "t-1", None, "ana", "because")
    assert lever_command(rule.action, "t-1", step, "ana", "because").saga_id == "t-1"
    with pytest.raises(LeverRefused, match="unknown action"):
        lever_command("Nudge", "t-1", None, "ana", "because")
