"""Whether a worker consumes each participant's commands: a snapshot of the attendance of the deployment's command
topics (``infra.kafka_admin.topic_attendance``), refreshed in the background, so that no page waits on Kafka.

A step whose participant has no worker times out and retries with nothing to say why; the snapshot says it (the
inbox lists such a topic, the saga page names it beside the step). "Unattended since" is when the snapshot first
saw the topic without a consumer and with commands waiting: the first refresh after the last worker left, not the
moment it left.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..infra.chores import Chore
from ..infra.kafka_admin import TopicAttendance, topic_attendance
from ..infra.kafka_clients import KafkaClients
from ..schemas.topics import Topics

REFRESH_EVERY_S = 10.0

Probe = Callable[[KafkaClients, Sequence[str]], Awaitable[dict[str, TopicAttendance]]]


@dataclass(frozen=True)
class CommandTopic:
    """The attendance of participant ``participant``'s command topic ``topic``: ``consumers`` (members of stable
    groups assigned any of its partitions) and ``waiting`` (commands no group has committed past); None: unknown.
    ``unattended_since_ms``: when the snapshot first saw it unattended (kept through an unknown refresh, dropped
    once a worker consumes it or nothing waits)."""

    participant: str
    topic: str
    consumers: int | None = None
    waiting: int | None = None
    unattended_since_ms: int | None = None

    @property
    def known(self) -> bool:
        return self.consumers is not None

    @property
    def unattended(self) -> bool:
        """Known to have no consumer while commands wait on it."""
        return self.consumers == 0 and (self.waiting or 0) > 0

    @property
    def consumed(self) -> bool:
        """Known to have a consumer."""
        return (self.consumers or 0) > 0

    def describe(self) -> str:
        """What an operator reads, e.g. "no worker consumes payment.commands; 3 commands wait"."""
        if not self.known:
            return f"unknown whether a worker consumes {self.topic}"
        if not self.consumed:
            waiting = self.waiting or 0
            return f"no worker consumes {self.topic}; " + ("1 command waits" if waiting == 1
                                                           else f"{waiting} commands wait")
        return ("1 worker consumes" if self.consumers == 1 else f"{self.consumers} workers consume") + f" {self.topic}"

@dataclass(frozen=True)
class AttendanceSnapshot:
    """The command topics' attendance as last seen, by participant; ``taken_at_ms`` None: not taken yet."""

    topics: Mapping[str, CommandTopic] = field(default_factory=dict)
    taken_at_ms: int | None = None

    def of(self, participant: str) -> CommandTopic | None:
        """The attendance of ``participant``'s commands; None when not taken yet or not of the deployment."""
        return self.topics.get(participant)

    def unattended(self) -> list[CommandTopic]:
        """The topics known to have no consumer while commands wait, by participant."""
        return [self.topics[name] for name in sorted(self.topics) if self.topics[name].unattended]

    def unconsumed(self, participants: Iterable[str | None]) -> list[CommandTopic]:
        """The command topics of ``participants`` (None: a step that sends nothing) known to have no consumer, each
        once, by participant: a step in flight with one waits for nothing."""
        named = {name for name in participants if name is not None}
        return [self.topics[name] for name in sorted(named & set(self.topics))
                if self.topics[name].known and not self.topics[name].consumed]

    def followed_by(self, found: Mapping[str, TopicAttendance], topics: Mapping[str, str],
                    now_ms: int) -> AttendanceSnapshot:
        """The snapshot after this one given what a refresh ``found`` (by topic) at ``now_ms``; ``topics``: each
        participant's command topic. An unknown topic keeps its unattended-since, so a broker's hiccup does not
        restart the clock."""
        following = {}
        for participant, topic in topics.items():
            seen = found.get(topic, TopicAttendance(topic))
            before = self.topics.get(participant)
            current = CommandTopic(participant, topic, seen.consumers, seen.waiting)
            since = before.unattended_since_ms if before is not None else None
            if current.unattended:
                since = since if since is not None else now_ms
            elif current.known:
                since = None
            following[participant] = CommandTopic(participant, topic, seen.consumers, seen.waiting, since)
        return AttendanceSnapshot(following, now_ms)


class Attendance:
    """The deployment's command topics' attendance, kept by ``refresh`` (run by ``chore``): ``snapshot`` never
    waits on Kafka."""

    def __init__(self, kafka: KafkaClients, topics: Topics, participants: Sequence[str],
                 now_ms: Callable[[], int], probe: Probe = topic_attendance) -> None:
        self.snapshot = AttendanceSnapshot()
        self._kafka = kafka
        self._topics = {name: topics.commands(name) for name in dict.fromkeys(participants)}
        self._now_ms = now_ms
        self._probe = probe

    async def refresh(self) -> int:
        """Take a new snapshot (every topic unknown when Kafka does not answer); 0, the chore's count of work."""
        found = await self._probe(self._kafka, list(self._topics.values())) if self._topics else {}
        self.snapshot = self.snapshot.followed_by(found, self._topics, self._now_ms())
        return 0

    def chore(self, every_s: float = REFRESH_EVERY_S) -> Chore:
        """What refreshes the snapshot every ``every_s`` seconds, the first time at once."""
        return Chore("command topic attendance", self.refresh, every_s)
