"""Writing saga types and their participants: what a team imports (``from saga_orchestrator.authoring import
...``).

- ``Saga``: a saga type (its input model, its steps, signals and waits); ``SagaApp``: the one app object of a
  deployment (its saga types, participants and records), which every process loads (``SAGA_APP``).
- ``participant``, ``StepContext``, ``EffectTable``: a participant's typed actions and where their effects show.
- ``Succeeded``, ``Failed``, ``StepFailed``, ``Deferred``: what an action answers.
- ``RetryPolicy``, ``FailureMode``, ``Condition``, ``Expiry``, ``UNLIMITED_RETRY``: how a step retries, fails,
  runs or waits.

Everything else in the package is internal and may change in any release; ``saga_orchestrator.client`` and
``saga_orchestrator.testing`` are the other two public modules.
"""

from __future__ import annotations

from ..orchestrator.domain.definition import UNLIMITED_RETRY, Condition, Expiry, FailureMode, RetryPolicy
from ..participants.kit.effects import EffectTable
from ..participants.kit.outcome import Deferred, Failed, StepFailed, Succeeded
from ..participants.kit.participant import Participant
from ..participants.kit.typed import Action, Calling, StepContext, participant
from .saga import Saga, SagaApp, SignalRef, StepRef

__all__ = [
    "UNLIMITED_RETRY",
    "Action",
    "Calling",
    "Condition",
    "Deferred",
    "EffectTable",
    "Expiry",
    "Failed",
    "FailureMode",
    "Participant",
    "RetryPolicy",
    "Saga",
    "SagaApp",
    "SignalRef",
    "StepContext",
    "StepFailed",
    "StepRef",
    "Succeeded",
    "participant",
]
