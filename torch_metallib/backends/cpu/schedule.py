"""How the CPU backend orders a kernel's threads: ``torch_metallib.cpu_schedule``.

``"parallel"`` (the default) spreads threadgroups over torch's threads. Two debug modes
help kernel authors find ordering bugs that a GPU hides or shows only sometimes:

* ``"sequential"``: threadgroups one at a time in order on one thread and, within a
  barrier interval, threads in index order; runs are deterministic (atomics included).
* ``"permuted"``: every kernel runs with its threads as coroutines. Threadgroups run one at a
  time in a shuffled order, and the thread order is shuffled again in every barrier
  interval, so a read of threadgroup memory that lacks a barrier sees a different writer
  on each run. Shuffles depend only on ``seed``: a failing seed replays exactly.

The environment variable ``TORCH_METALLIB_CPU_SCHEDULE`` (``parallel``, ``sequential``,
``permuted`` or ``permuted:<seed>``) sets the default without code changes.
"""

import contextlib
import contextvars
from typing import NamedTuple

from torch_metallib import config

__all__ = ["Schedule", "cpu_schedule", "current_schedule", "register_environment_schedule", "MODES"]

MODES = ("parallel", "sequential", "permuted")
ENVIRONMENT_VARIABLE = config.CPU_SCHEDULE.name


class Schedule(NamedTuple):
    mode: str
    seed: int


def _checked(mode, seed, source: str) -> Schedule:
    if mode not in MODES:
        raise ValueError(f"{source}: unknown CPU schedule {mode!r}; expected one of {', '.join(MODES)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"{source}: seed must be an int in [0, 2**64), got {seed!r}")
    return Schedule(mode, seed)


def _from_environment() -> Schedule:
    text = config.CPU_SCHEDULE.get()
    mode, _, seed = text.partition(":")
    source = f"{ENVIRONMENT_VARIABLE}={text!r}"
    if seed and not seed.isdigit():
        raise ValueError(f"{source}: the seed after ':' must be a decimal integer")
    return _checked(mode, int(seed) if seed else 0, source)


_current: contextvars.ContextVar = contextvars.ContextVar("torch_metallib_cpu_schedule")


def current_schedule() -> Schedule:
    """The schedule kernel calls use here: the innermost ``cpu_schedule``, else the
    environment's (checked on first use), else ``parallel``."""
    schedule = _current.get(None)
    if schedule is None:
        schedule = _from_environment()
        _current.set(schedule)
    return schedule


@contextlib.contextmanager
def cpu_schedule(mode: str, seed: int = 0):
    """Runs the CPU kernel calls inside the ``with`` block (in this thread or async task)
    with schedule `mode`: ``"parallel"``, ``"sequential"`` or ``"permuted"`` (shuffled
    from `seed`). See the module docstring."""
    schedule = _checked(mode, seed, "cpu_schedule")
    token = _current.set(schedule)
    debug = schedule.mode != "parallel"
    if debug:
        _native_users(1)
    try:
        yield
    finally:
        _current.reset(token)
        if debug:
            _native_users(-1)


def _native_users(delta: int) -> None:
    """Registered operators run in native code, which asks Python for the schedule only
    while some debug schedule is in effect; this keeps their count."""
    from ... import _C
    _C.add_debug_schedule_users(delta)


_environment_registered = False


def register_environment_schedule() -> None:
    """Counts the environment's debug schedule, if any, once (see _native_users)."""
    global _environment_registered
    if not _environment_registered:
        if _from_environment().mode != "parallel":  # raises for a malformed variable: retried next time
            _native_users(1)
        _environment_registered = True
