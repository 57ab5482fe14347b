"""Business rules of the notification participant (pure)."""

from __future__ import annotations

from ..kit.outcome import Failed, Proceed, Verdict

BOUNCE_DOMAIN = "@bounce.test"  # demo trigger: a mailbox that recovers after a few tries
BOUNCE_FAILURES = 3


def send_itinerary_rule(email: str, attempt: int) -> Verdict:
    """Mailboxes on the bounce domain are unavailable for the first BOUNCE_FAILURES attempts."""
    if email.endswith(BOUNCE_DOMAIN) and attempt <= BOUNCE_FAILURES:
        reason = f"mailbox {email} unavailable (attempt {attempt})"
        return Failed("MailboxUnavailable", reason, retryable=True)
    return Proceed()
