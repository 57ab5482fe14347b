"""Business rules of the payment participant (pure); card tokens trigger the demo behaviours."""

from __future__ import annotations

from ..kit.outcome import Failed, Proceed, Verdict

DECLINED_TOKEN = "tok_declined"  # charge fails for good
FLAKY_TOKEN = "tok_flaky"  # charge fails transiently on the first FLAKY_FAILURES attempts
SLOW_TOKEN = "tok_slow"  # first attempt charges but its reply arrives after the step timeout
FLAKY_FAILURES = 2
# Longer than the trip saga's payment step timeout (~2 s), so the orchestrator retries with the same key
# and the retry gets the recorded reply at once.
SLOW_REPLY_DELAY_MS = 4000


def charge_card_rule(card_token: str, attempt: int) -> Verdict:
    """Whether a charge goes ahead on this attempt, and how long its reply is held back."""
    if card_token == DECLINED_TOKEN:
        return Failed("CardDeclined", "the issuer declined the card")
    if card_token == FLAKY_TOKEN and attempt <= FLAKY_FAILURES:
        return Failed("CardNetworkTimeout", f"card network timed out (attempt {attempt})", retryable=True)
    if card_token == SLOW_TOKEN and attempt == 1:
        return Proceed(reply_delay_ms=SLOW_REPLY_DELAY_MS)
    return Proceed()
