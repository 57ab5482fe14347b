"""The Python client of the saga orchestrator: start, cancel, resume and await sagas over Kafka; ask a saga's state
through the console's HTTP API."""

from ..schemas.message_types import LeverRefused
from .api import ApiError, SagaApi, SagaNotFound, SagaStatus
from .saga_client import SagaClient, SagaHandle, SagaInputError, StartRefused

__all__ = ["ApiError", "LeverRefused", "SagaApi", "SagaClient", "SagaHandle", "SagaInputError", "SagaNotFound",
           "SagaStatus", "StartRefused"]
