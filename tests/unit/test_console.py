"""The console's pure parts: which levers it offers (asked of the orchestrator's own core), how an action is
checked before it is sent, who the operator is, and the refusals of a console set up wrong."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from starlette.datastructures import Headers

from saga_orchestrator.cli.console_cmd import check_bind
from saga_orchestrator.console import identity as identity_module
from saga_orchestrator.console.app import identity_of
from saga_orchestrator.console.identity import Identity, add_user, check_password, hash_password, read_users
from saga_orchestrator.console.operating import ActionRefused, Offer, message_for, offers
from saga_orchestrator.console.pages import dag_svg, timeline
from saga_orchestrator.infra.misconfigured import Misconfigured
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.sessions import memory_sessions
from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas.message_types import CancelSaga, OperateSaga, ReleaseSaga
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.testing.history import SagaRun


def _offered(run: SagaRun) -> set[tuple[str, str | None]]:
    return {(offer.action, offer.step) for offer in offers(TRIP, run.saga, run.now)}


def test_a_trip_waiting_on_its_hotel_may_be_cancelled_paused_forced_back_or_terminated() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    offered = _offered(run)
    assert {("Cancel", None), ("Pause", None), ("ForceCompensate", None), ("Terminate", None)} <= offered
    assert ("Unpause", None) not in offered and ("Resume", None) not in offered
    assert ("Skip", "book_hotel") not in offered  # the trip's steps do not opt in to Skip


def test_a_step_waiting_on_its_backoff_may_be_retried_now_and_only_that_one() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.fail("book_hotel", "HotelBusy", retryable=True)
    retries = {step for action, step in _offered(run) if action == "RetryNow"}
    assert retries == {"book_hotel"}


def test_a_paused_saga_offers_unpause_and_an_ended_one_offers_nothing_but_what_applies() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.operate("Pause")
    offered = _offered(run)
    assert ("Unpause", None) in offered and ("Pause", None) not in offered
    done = SagaRun(TRIP)
    done.start()
    for step in ("book_flight", "book_hotel", "charge_card", "send_itinerary"):
        done.ok(step)
    assert _offered(done) == set()
    assert offers(TRIP, None, 0) == []


@pytest.mark.parametrize(("action", "step", "reason", "error"), [
    ("Explode", None, "x", "unknown action 'Explode'"),
    ("RetryNow", None, None, "RetryNow needs the step it acts on"),
    ("Skip", "book_hotel", " ", "Skip needs a reason"),
    ("Terminate", None, None, "Terminate needs a reason"),
    ("Cancel", None, "", "Cancel needs a reason"),
    ("Redrive", None, None, "Redrive needs a reason"),
])
def test_an_action_asked_wrongly_is_refused_before_anything_is_sent(action: str, step: str | None,
                                                                     reason: str | None, error: str) -> None:
    with pytest.raises(ActionRefused, match=error):
        message_for("s1", action, step, "ops", reason)


def test_each_action_becomes_its_control_command_with_the_operator() -> None:
    assert message_for("s1", "Pause", "ignored", "ops", None) == OperateSaga(
        saga_id="s1", action="Pause", step=None, operator="ops", reason=None)
    assert message_for("s1", "Cancel", None, "ops", "asked") == CancelSaga(saga_id="s1", reason="asked",
                                                                           operator="ops")
    assert message_for("s1", "Release", None, "ops", "fixed") == ReleaseSaga(saga_id="s1", operator="ops",
                                                                             detail="fixed")
    assert Offer("Skip", "x").needs_reason and not Offer("Pause").needs_reason


def test_a_password_checks_against_its_hash_only() -> None:
    stored = hash_password("correct horse")
    assert check_password("correct horse", stored)
    assert not check_password("wrong horse", stored)
    assert not check_password("correct horse", "plain:text")


def test_the_users_file_is_written_and_read_back_and_a_bad_line_is_refused_naming_the_setting(tmp_path: Path) -> None:
    users = tmp_path / "users"
    add_user(users, "anna", "a long password")
    add_user(users, "ben", "another password")
    read = read_users(users)
    assert sorted(read) == ["anna", "ben"] and check_password("a long password", read["anna"])
    assert users.stat().st_mode & 0o777 == 0o600
    users.write_text("anna:plain\n")
    with pytest.raises(Misconfigured, match=r"^SAGA_CONSOLE_USERS=.*line 1 is not name:scrypt"):
        read_users(users)
    with pytest.raises(Misconfigured, match=r"^SAGA_CONSOLE_USERS=.*cannot read it"):
        read_users(tmp_path / "missing")


async def test_the_operator_comes_from_the_proxy_header_or_a_login_never_from_anything_else() -> None:
    async def who(identity: Identity, headers: dict[str, str], token: str | None = None) -> str | None:
        return (await identity.who(Headers(headers), token, "10.0.0.7")).operator

    proxied = Identity(header="X-Forwarded-User")
    assert await who(proxied, {"X-Forwarded-User": "anna"}) == "anna"
    assert await who(proxied, {}) is None
    sessions = memory_sessions()
    local = Identity(users={"anna": hash_password("a long password")}, sessions=sessions)
    anna, mallory = await sessions.open("anna"), await sessions.open("mallory")
    assert await who(local, {}, anna.token) == "anna"
    assert await who(local, {}, mallory.token) is None  # a session naming no user
    assert await who(local, {}, "a token of no session") is None
    await sessions.close(anna.token)
    assert await who(local, {}, anna.token) is None  # signed out: the cookie is worth nothing
    basic = base64.b64encode(b"anna:a long password").decode()
    assert await who(local, {"Authorization": f"Basic {basic}"}) == "anna"
    wrong = base64.b64encode(b"anna:guess").decode()
    assert await who(local, {"Authorization": f"Basic {wrong}"}) is None
    assert await who(local, {"X-Forwarded-User": "anna"}) is None
    assert await who(Identity(), {"X-Forwarded-User": "anna"}) is None


async def test_a_password_is_checked_once_whatever_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[str] = []
    real = identity_module.check_password

    def counted(password: str, stored: str) -> bool:
        checked.append(stored)
        return real(password, stored)

    monkeypatch.setattr(identity_module, "check_password", counted)
    local = Identity(users={"anna": hash_password("a long password")})
    assert not await local.sign_in("nobody", "a long password", "10.0.0.7")
    assert not await local.sign_in("anna", "guess", "10.0.0.7")
    assert await local.sign_in("anna", "a long password", "10.0.0.7")
    assert len(checked) == 3 and checked[0] == local.decoy  # one scrypt run each, an unknown name's on the decoy


def test_a_console_set_up_wrong_is_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(Misconfigured, match=r"^SAGA_CONSOLE_LEVERS=true needs to know who pulls them"):
        identity_of(Settings(saga_console_levers=True))
    with pytest.raises(Misconfigured, match=r"^SAGA_CONSOLE_OPERATOR_HEADER and SAGA_CONSOLE_USERS are both set"):
        identity_of(Settings(saga_console_operator_header="X-User", saga_console_users=str(tmp_path / "u")))
    assert identity_of(Settings(saga_console_levers=True, saga_console_operator_header="X-User")).mode == "proxy"
    assert identity_of(Settings()).mode == "anonymous"


def test_the_dag_draws_each_step_with_its_state_and_the_pivot_apart() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    drawn = dag_svg(TRIP, run.saga)
    assert drawn.count("<g data-step=") == 4 and drawn.count("<line ") == 3  # charge waits on both bookings
    assert '<g data-step="book_flight" data-status="SUCCEEDED">' in drawn
    assert '<g data-step="book_hotel" data-status="RUNNING">' in drawn
    assert 'data-step="send_itinerary" data-status="PENDING"' in drawn
    assert drawn.count('stroke-width="2"') == 1  # the pivot's frame


def test_a_header_named_operator_on_an_address_others_reach_is_refused_unless_a_proxy_guards_it() -> None:
    proxied = Settings(saga_console_levers=True, saga_console_operator_header="X-User")
    check_bind(proxied, "127.0.0.1")
    check_bind(proxied, "::1")
    check_bind(Settings(), "0.0.0.0")  # nobody is named by a header: a read-only console anyone may reach
    with pytest.raises(Misconfigured, match=r"^--host 0\.0\.0\.0 with SAGA_CONSOLE_OPERATOR_HEADER: .*"
                                            r"SAGA_CONSOLE_BEHIND_PROXY=true"):
        check_bind(proxied, "0.0.0.0")
    check_bind(proxied.model_copy(update={"saga_console_behind_proxy": True}), "10.1.2.3")


def test_a_retry_loop_of_one_step_is_one_row_of_the_timeline() -> None:
    run = SagaRun(TRIP, saga_id="looping")
    run.start()
    run.ok("book_flight")
    for _ in range(2):  # the hotel is busy twice: its third attempt goes through
        run.fail("book_hotel", "HotelBusy", retryable=True)
        run.fire(TimerKind.STEP_RETRY, "book_hotel")
    run.ok("book_hotel")
    rows = timeline([(event.occurred_at, event) for event in run.events], default_registry())
    [loop] = [row for row in rows if row["type"] == "RetryLoop"]
    assert (loop["step"], loop["attempt"]) == ("book_hotel", "1\u20132")
    assert loop["detail"].startswith("attempts 1\u20132, HotelBusy")
    after = rows[rows.index(loop) + 1]  # the attempt sent last went through
    assert (after["type"], after["step"], after["attempt"]) == ("StepSucceeded", "book_hotel", 3)
    assert sum(1 for row in rows if row["step"] == "book_hotel" and row["type"] == "StepFailed") == 0
