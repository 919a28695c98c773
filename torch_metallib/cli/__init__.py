"""Stage 7: the command line, ``python -m torch_metallib`` or ``torch-metallib``
(``main``: argument parsing; ``inspect``: header, function table and reflection;
``corpus``: the Apple-built reference library)."""

import os
import sys

__all__ = ["program_name"]


def program_name() -> str:
    """How the user started us: the console script by its name, else ``python -m``."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return script if script.startswith("torch-metallib") else "python -m torch_metallib"
