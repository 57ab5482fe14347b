"""The Python client of the saga orchestrator: start, cancel, resume and await sagas over Kafka; ask a saga's state
through the console's HTTP API."""

from .api import ApiError, SagaApi, SagaNotFound, SagaStatus
from .saga_client import SagaClient, SagaHandle, SagaInputError, StartRefused

__all__ = ["ApiError", "SagaApi", "SagaClient", "SagaHandle", "SagaInputError", "SagaNotFound", "SagaStatus",
           "StartRefused"]
