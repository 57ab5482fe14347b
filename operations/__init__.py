"""The operations wing: every operator use-case once (levers, bulk jobs, dead letters, verify, the reads of the
console and the command line, the operator audit), over the store port of ``operations.ports``.

The faces (``cli``, ``console``, ``client``) map arguments and errors onto these use-cases and hold no rule of
their own; the Postgres adapters of the port live with the orchestrator's store
(``orchestrator.store.operations``), its memory adapters serve the test kit.
"""
