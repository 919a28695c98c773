"""Every environment variable torch_metallib reads, declared once (docs/configuration.md).

Each knob has a type, a default and a one-line description, and is read when it is used
(not at import), so a variable set or changed while the process runs takes effect at the
next use::

    from torch_metallib import config
    if config.CACHE.get():
        ...

An unset variable and an empty one both mean the default. Booleans take ``1``, ``true``,
``yes``, ``on`` (true) or ``0``, ``false``, ``no``, ``off`` (false), in any case; any other
value raises ConfigurationError naming the variable and the accepted values.
"""

import os
from typing import Dict, Optional, Tuple

from .errors import TorchMetallibError

__all__ = ["ConfigurationError", "Knob", "BoolKnob", "PathKnob", "PathListKnob", "ChoiceKnob", "KNOBS", "markdown_table"]

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class ConfigurationError(TorchMetallibError, ValueError):
    """An environment variable that torch_metallib reads has a value it does not accept."""


KNOBS: Dict[str, "Knob"] = {}


class Knob:
    """One environment variable: its `name`, `default` (returned when it is unset or empty),
    `doc` (one line) and `shown_default` (the default as the documentation writes it)."""

    kind = "string"

    def __init__(self, name: str, default, doc: str, shown_default: Optional[str] = None):
        if name in KNOBS:
            raise ValueError(f"{name} is declared twice")
        self.name, self.default, self.doc = name, default, doc
        self.shown_default = shown_default if shown_default is not None else (
            "unset" if default is None else f"`{default}`")
        KNOBS[name] = self

    def raw(self) -> Optional[str]:
        """The variable's text, or None when it is unset or empty."""
        text = os.environ.get(self.name)
        return text if text and text.strip() else None

    def get(self):
        """The variable's value now: parsed, or the default when it is unset or empty."""
        text = self.raw()
        return self.default if text is None else self.parse(text)

    def parse(self, text: str):
        return text.strip()

    def error(self, text: str, expected: str) -> ConfigurationError:
        return ConfigurationError(f"{self.name}={text!r}: expected {expected}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, default={self.default!r})"


class BoolKnob(Knob):
    kind = "boolean"

    def __init__(self, name: str, default: bool, doc: str):
        super().__init__(name, default, doc, shown_default="`1`" if default else "`0`")

    def parse(self, text: str) -> bool:
        word = text.strip().lower()
        if word in TRUE:
            return True
        if word in FALSE:
            return False
        raise self.error(text, f"one of {', '.join(TRUE)} (true) or {', '.join(FALSE)} (false)")


class PathKnob(Knob):
    kind = "path"

    def parse(self, text: str) -> str:
        return os.path.expanduser(text.strip())


class PathListKnob(Knob):
    kind = "path list"

    def parse(self, text: str) -> Tuple[str, ...]:
        return tuple(os.path.expanduser(p.strip()) for p in text.split(os.pathsep) if p.strip())


class ChoiceKnob(Knob):
    kind = "choice"

    def __init__(self, name: str, default: Optional[str], doc: str, choices: Tuple[str, ...]):
        super().__init__(name, default, doc)
        self.choices = choices

    def parse(self, text: str) -> str:
        word = text.strip().lower()
        if word not in self.choices:
            raise self.error(text, f"one of {', '.join(self.choices)}")
        return word


# The disk cache (cache/disk_cache.py).
CACHE = BoolKnob("TORCH_METALLIB_CACHE", True,
                 "Keep compiled kernels and call records in the disk cache; `0` turns the cache off.")
CACHE_DIR = PathKnob("TORCH_METALLIB_CACHE_DIR", None, "The disk cache's folder.",
                     shown_default="`$XDG_CACHE_HOME/torch_metallib`")
XDG_CACHE_HOME = PathKnob("XDG_CACHE_HOME", None, "The user's cache folder, under which the disk cache and "
                          "the reference corpus live.", shown_default="`~/.cache`")
ARCHIVES = PathListKnob("TORCH_METALLIB_ARCHIVES", (), "Ahead-of-time archives (`precompile`) that every "
                        "library's calls take compiled kernels from before compiling, separated by `:`.",
                        shown_default="unset")
METAL_ARCHIVE = BoolKnob("TORCH_METALLIB_METAL_ARCHIVE", True,
                         "On Apple GPUs, keep compiled pipelines in a binary archive under the cache folder "
                         "(`metal/`), so later processes skip compiling them; `0` turns it off.")

# Running kernels.
CHECKED = BoolKnob("TORCH_METALLIB_CHECKED", False,
                   "Run every call checked (bounds-checked on the CPU backend) unless the call or a "
                   "`checked()` block says otherwise.")
INITCHECK = BoolKnob("TORCH_METALLIB_INITCHECK", False,
                     "In checked calls, also report reads of threadgroup memory no thread of the "
                     "threadgroup has written (the threadgroup initcheck; some correct kernels read "
                     "slots they never wrote and discard them) unless a `checked()` block says otherwise.")
CPU_SCHEDULE = Knob("TORCH_METALLIB_CPU_SCHEDULE", "parallel",
                    "The CPU backend's default thread order: `parallel`, `sequential`, `permuted` or "
                    "`permuted:<seed>`.")
CPU_LANES = BoolKnob("TORCH_METALLIB_CPU_LANES", True,
                     "Run cooperative kernels on the CPU as lane loops where they allow; `0` runs them "
                     "as coroutines.")
CPU_VECTORIZE = BoolKnob("TORCH_METALLIB_CPU_VECTORIZE", False,
                         "Run the lane loops' regions that allow it a vector of threads at a time "
                         "(`KernelFunction.cpu_scheme` is then `vector`); `1` turns it on.")

# The CUDA backend's tools.
LIBDEVICE = PathKnob("TORCH_METALLIB_LIBDEVICE", None,
                     "NVIDIA's `libdevice.10.bc`, when it is not found in a CUDA toolkit or package.")
PTXAS = PathKnob("PTXAS", None, "CUDA's `ptxas`, used to check PTX and to assemble archives' cubins ahead of "
                 "time, when it is not on `PATH`.")
CUDA_HOME = PathKnob("CUDA_HOME", None, "A CUDA toolkit to take `libdevice` and `ptxas` from.")
CUDA_PATH = PathKnob("CUDA_PATH", None, "Another CUDA toolkit to take them from (after `CUDA_HOME`).")

# Diagnostics.
LOG = ChoiceKnob("TORCH_METALLIB_LOG", None,
                 "Log compiles and disk-cache hits and misses to stderr, at this level.",
                 choices=("debug", "info", "warning", "error"))
DUMP_IR = PathKnob("TORCH_METALLIB_DUMP_IR", None,
                   "Write each kernel compiled in this process, at each lowering stage, under this folder.")

# Reference corpora (the command line and the doctor).
CORPUS_DIR = PathKnob("TORCH_METALLIB_CORPUS_DIR", None,
                      "Where `python -m torch_metallib corpus` keeps the reference libraries.",
                      shown_default="`$XDG_CACHE_HOME/torch_metallib/corpus`")
PUBLIC_CORPUS = PathKnob("TM_PUBLIC_CORPUS", None, "The public corpus of third-party libraries that the "
                         "doctor reports on.", shown_default="`~/.cache/torch_metallib/public-corpus`")


def markdown_table() -> str:
    """The table of every knob (docs/configuration.md holds it as printed here)."""
    lines = ["| Variable | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for knob in KNOBS.values():
        kind = knob.kind if not isinstance(knob, ChoiceKnob) else " \\| ".join(f"`{c}`" for c in knob.choices)
        lines.append(f"| `{knob.name}` | {kind} | {knob.shown_default} | {knob.doc} |")
    return "\n".join(lines) + "\n"
