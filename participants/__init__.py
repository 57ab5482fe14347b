"""Saga participants: the kit, the reference participants, their worker and an effects reader."""
