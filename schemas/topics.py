"""Topic names of the wire contract; an optional prefix namespaces a deployment (or a test)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topics:
    """Every topic name for one prefix."""

    prefix: str = ""

    @property
    def start(self) -> str:
        return f"{self.prefix}saga.start"

    @property
    def control(self) -> str:
        return f"{self.prefix}saga.control"

    @property
    def events(self) -> str:
        return f"{self.prefix}saga.events"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}saga.dlq"

    def commands(self, participant: str) -> str:
        return f"{self.prefix}{participant}.commands"

    def results(self, participant: str) -> str:
        return f"{self.prefix}{participant}.results"

    def all(self, participants: tuple[str, ...]) -> list[str]:
        """Every topic of the contract for these participants, for creation at start-up."""
        names = [self.start, self.control, self.events, self.dlq]
        for participant in participants:
            names += [self.commands(participant), self.results(participant)]
        return names
