"""``python -m cli`` is the ``saga`` command."""

from cli.main import app

app()
