"""The names a user imports, pinned: a name added to or gone from a public module is a decision, made here and
in the changelog. The 0.1 import path of the authoring names still works, with a warning naming the new one."""

from __future__ import annotations

import importlib
import warnings

import pytest

PUBLIC = {
    "saga_orchestrator.authoring": [
        "Action", "Calling", "Condition", "Deferred", "EffectTable", "Expiry", "Failed", "FailureMode", "Participant",
        "RetryPolicy", "Saga", "SagaApp", "SignalRef", "StepContext", "StepFailed", "StepRef", "Succeeded",
        "UNLIMITED_RETRY", "participant"],
    "saga_orchestrator.client": [
        "ApiError", "LeverRefused", "SagaApi", "SagaClient", "SagaHandle", "SagaInputError", "SagaNotFound",
        "SagaStatus", "StartRefused"],
    "saga_orchestrator.testing": [
        "Behaviour", "FaultCase", "ParticipantHarness", "Reply", "SagaEnvironment", "SagaResult", "SagaWaits",
        "answer_late", "defer", "fail", "fail_transiently", "fault_matrix", "succeed", "time_out"],
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_each_public_module_exports_exactly_its_pinned_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == sorted(PUBLIC[module_name])
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_the_01_authoring_path_warns_and_gives_the_same_objects() -> None:
    from saga_orchestrator import authoring

    with pytest.warns(DeprecationWarning, match=r"saga_orchestrator\.orchestrator\.authoring\.Saga is "
                                                r"saga_orchestrator\.authoring\.Saga since 0\.2"):
        from saga_orchestrator.orchestrator.authoring import Saga
    assert Saga is authoring.Saga


def test_a_name_the_old_path_never_had_is_an_error_naming_the_new_module() -> None:
    module = importlib.import_module("saga_orchestrator.orchestrator.authoring")
    with warnings.catch_warnings(), pytest.raises(AttributeError, match=r"saga_orchestrator\.authoring"):
        module.NoSuchName  # noqa: B018


def test_a_01_package_using_what_02_replaced_is_refused_at_start_in_one_line() -> None:
    from saga_orchestrator.infra.misconfigured import Misconfigured
    from saga_orchestrator.infra.settings import Settings
    from saga_orchestrator.orchestrator.bootstrap import definitions

    with pytest.raises(Misconfigured) as refused:
        definitions(Settings(saga_definitions="tests.unit.packages.rules_01:DEFINITION"))
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith("SAGA_DEFINITIONS='tests.unit.packages.rules_01:DEFINITION': cannot import")
    assert "EffectRules was removed in 0.2: declare where each participant's effects show instead" in said
