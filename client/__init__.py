"""The Python client of the saga orchestrator: start, cancel, resume and await sagas over Kafka."""

from .saga_client import SagaClient, SagaHandle, SagaInputError, StartRefused

__all__ = ["SagaClient", "SagaHandle", "SagaInputError", "StartRefused"]
