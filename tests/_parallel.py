"""How many processes a test may run side by side: the cores this process may use, shared
among pytest-xdist's workers when the suite runs with -n (each worker runs tests of its own)."""

import os


def cores() -> int:
    """This worker's share of the machine's cores (at least 1)."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        available = os.cpu_count() or 1
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, available // workers)
