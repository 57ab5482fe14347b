"""The operator's console: a web UI and its HTTP API over the orchestrator's database and saga.control.

``console.app.console_app(settings)`` is its composition root; ``saga console`` serves it. It reads the
orchestrator's tables (``operations.reads``) and acts only by publishing control commands that the orchestrator's
pure core decides (``console.operating``); every action is audited in ``saga.operator_audit``.
"""
