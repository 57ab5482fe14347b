"""``python -m saga_orchestrator.cli`` is the ``saga`` command."""

from . import main

main()
