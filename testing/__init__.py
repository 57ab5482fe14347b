"""Test a saga without Kafka, Postgres or a clock: what a team tests its own sagas and participants with.

- ``SagaEnvironment`` (``environment``): sagas run in-process on the orchestrator's own pipeline and a memory
  store, participants answering as scripted (``succeed``, ``fail``, ``fail_transiently``, ``time_out``,
  ``answer_late``, ``defer``) or stopped and started again (``stop``, ``start_participant``), on a virtual clock:
  ``start``, ``advance``, ``result``.
- ``fault_matrix`` (``fault_matrix``): for any saga, one case per step failing for good, per step answering after
  its timeout, per step in flight when the saga is cancelled or its deadline passes (the turn-back fence), and
  every message delivered twice, each with the outcome and compensations it must have.
- ``ParticipantHarness`` (``participants``): a participant's real handlers through the kit's real transaction
  path against a real Postgres, without Kafka.
- ``SagaRun`` (``history``): one saga's history message by message through the pure core, every step checked.
"""

from __future__ import annotations

from .behaviour import Behaviour, answer_late, defer, fail, fail_transiently, succeed, time_out
from .environment import SagaEnvironment, SagaResult, SagaWaits
from .fault_matrix import FaultCase, fault_matrix
from .participants import ParticipantHarness, Reply

__all__ = [
    "Behaviour",
    "FaultCase",
    "ParticipantHarness",
    "Reply",
    "SagaEnvironment",
    "SagaResult",
    "SagaWaits",
    "answer_late",
    "defer",
    "fail",
    "fail_transiently",
    "fault_matrix",
    "succeed",
    "time_out",
]
