"""Saga packages as teams wrote them for earlier releases: what an upgrade must run, or refuse in one line."""
