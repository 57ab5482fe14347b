"""The operator's levers of ``SagaClient``, one per row of ``schemas.message_types.ACTION_RULES``.

Each method is one line over ``pull``, which builds the command with ``lever_command`` (the one place that says
whether an action needs a step or a reason) and publishes it; its docstring is the table's. The signatures are
the client's public API as 0.1 shipped it (``resume`` and ``release`` call their reason ``detail``).
"""

from __future__ import annotations

from ..schemas.message_types import (
    ACTION_RULES,
    CANCEL,
    RELEASE,
    RESUME,
    SAGA_ACTIONS,
    ControlCommand,
    Lever,
    action_name,
)
from ..schemas.message_types import lever_command as _lever_command


class LeverMethods:
    """Every action of ``SAGA_ACTIONS`` as a method; a subclass provides ``control`` (publish one command)."""

    async def control(self, message: ControlCommand) -> None:
        raise NotImplementedError

    async def pull(self, action: str, saga_id: str, step: str | None = None, reason: str | None = None,
                   operator: str | None = None) -> None:
        """Publish ``action`` on ``saga_id`` (its step and reason where its row says); LeverRefused when it is
        asked wrongly, nothing published. The saga's history records it, or why it could not apply."""
        await self.control(_lever_command(action, saga_id, step, operator, reason))

    async def cancel(self, saga_id: str, reason: str, operator: str | None = None) -> None:
        await self.pull(CANCEL, saga_id, None, reason, operator)

    async def resume(self, saga_id: str, operator: str | None = None, detail: str | None = None) -> None:
        await self.pull(RESUME, saga_id, None, detail, operator)

    async def release(self, saga_id: str, operator: str | None = None, detail: str | None = None) -> None:
        await self.pull(RELEASE, saga_id, None, detail, operator)

    async def retry_now(self, saga_id: str, step: str, operator: str | None = None, reason: str | None = None
                        ) -> None:
        await self.pull(Lever.RETRY_NOW, saga_id, step, reason, operator)

    async def skip(self, saga_id: str, step: str, reason: str, operator: str | None = None) -> None:
        await self.pull(Lever.SKIP, saga_id, step, reason, operator)

    async def force_compensate(self, saga_id: str, reason: str, operator: str | None = None) -> None:
        await self.pull(Lever.FORCE_COMPENSATE, saga_id, None, reason, operator)

    async def terminate(self, saga_id: str, reason: str, operator: str | None = None) -> None:
        await self.pull(Lever.TERMINATE, saga_id, None, reason, operator)

    async def pause(self, saga_id: str, reason: str | None = None, operator: str | None = None) -> None:
        await self.pull(Lever.PAUSE, saga_id, None, reason, operator)

    async def unpause(self, saga_id: str, reason: str | None = None, operator: str | None = None) -> None:
        await self.pull(Lever.UNPAUSE, saga_id, None, reason, operator)

    async def redrive(self, saga_id: str, reason: str, operator: str | None = None) -> None:
        await self.pull(Lever.REDRIVE, saga_id, None, reason, operator)


for _action in SAGA_ACTIONS:  # the help of each method is its row's
    _rule = ACTION_RULES[_action]
    getattr(LeverMethods, action_name(_action)).__doc__ = (
        f"Publish {_action} on saga.control: {_rule.does}"
        + (f"; ``reason``: {_rule.reason}" if _rule.reason else "")
        + ". The saga's history records it, or why it could not apply; LeverRefused when asked wrongly.")
