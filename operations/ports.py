"""The store port of the operations wing: what its use-cases read and write, not how a database provides it.

Each Protocol is sized to the use-case that calls it. Adapters: ``orchestrator.store.operations`` (one module per
concern, each with its Postgres and its memory adapter); both pass the same contract suite
(``tests/contract/``). Times are epoch milliseconds, as in ``orchestrator.ports``.
"""

from __future__ import annotations

# -- reads of the console and the command line; the console's sessions; verify's snapshot; table signals --

# -- levers, the operator audit, bulk jobs, dead letters --
