"""Where 0.1 imported the authoring names from; since 0.2 they are ``saga_orchestrator.authoring``'s.

Each name still imports from here, with a DeprecationWarning naming its new home; this module goes in 0.3.
"""

from __future__ import annotations

import warnings
from typing import Any

from .. import authoring

MOVED_TO = "saga_orchestrator.authoring"


def __getattr__(name: str) -> Any:
    if name in authoring.__all__:
        warnings.warn(f"saga_orchestrator.orchestrator.authoring.{name} is {MOVED_TO}.{name} since 0.2: "
                      f"import it from {MOVED_TO}", DeprecationWarning, stacklevel=2)
        return getattr(authoring, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r} (the authoring names are in {MOVED_TO})")
