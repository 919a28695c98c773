"""``python -m torch_metallib``: the command line (see ``torch_metallib.cli``)."""

import sys

from .cli.main import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
