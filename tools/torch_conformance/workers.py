"""Kernels checked in child processes: a crash or a hang costs one kernel, not the run.

A worker process loads the library once and checks the kernels it is sent, one at a time,
answering each with a JSON line. When a worker dies the kernel it held is a crash; when it
does not answer within the timeout it is killed and the kernel is a hang. Either way a new
worker takes the remaining kernels.
"""

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterable, List

_WORKER = [sys.executable, "-m", "tools.torch_conformance.worker"]
RECYCLE_AFTER = 400  # kernels a worker checks before a fresh one takes over


class _Worker:
    def __init__(self, library: str, device: str, root: str):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # stderr goes to a file: a pipe nobody reads would fill and stall the worker.
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            _WORKER + [library, device], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.errors, text=True, env=env)
        self.kernel = None
        self.started = 0.0
        self.answered = 0

    def send(self, kernel: str) -> None:
        self.kernel, self.started = kernel, time.monotonic()
        self.process.stdin.write(kernel + "\n")
        self.process.stdin.flush()

    def kill(self) -> str:
        """Ends the worker; the end of what it wrote to stderr."""
        self.process.kill()
        self.process.wait()
        self.errors.seek(0)
        return self.errors.read()[-2000:]


def run_kernels(library: str, kernels: Iterable[str], device: str, workers: int,
                timeout: float, root: str, progress=None, time_limit: float = 0) -> List[Dict]:
    """One outcome per kernel: {"kernel", "outcome", "detail", "seconds"}. Past `time_limit`
    seconds (0: none) no kernel is started; those left are reported as not attempted."""
    pending = list(kernels)[::-1]
    outcomes: List[Dict] = []
    pool: List[_Worker] = []
    started = time.monotonic()
    while pending or any(w.kernel for w in pool):
        if time_limit and pending and time.monotonic() - started > time_limit:
            outcomes += [{"kernel": name, "outcome": "not attempted", "seconds": 0,
                          "detail": f"the run's time limit ({time_limit:.0f} s) ended before it"} for name in pending]
            pending = []
            continue
        while len(pool) < workers and pending:
            pool.append(_Worker(library, device, root))
        for worker in pool:
            if worker.kernel is None and pending:
                worker.send(pending.pop())
        busy = [w for w in pool if w.kernel]
        readable, _, _ = select.select([w.process.stdout for w in busy], [], [], 0.5)
        now = time.monotonic()
        for worker in busy:
            line = worker.process.stdout.readline() if worker.process.stdout in readable else None
            if line:
                outcomes.append(json.loads(line))
                worker.kernel = None
                worker.answered += 1
                if worker.answered >= RECYCLE_AFTER:  # compiled kernels stay mapped: start afresh
                    worker.process.stdin.close()
                    worker.process.wait()
                    pool.remove(worker)
            elif line == "" or now - worker.started > timeout:
                hung = line is None
                err = worker.kill()
                outcomes.append({
                    "kernel": worker.kernel, "outcome": "hang" if hung else "crash",
                    "detail": f"no answer in {timeout:.0f} s" if hung else err.strip()[-500:],
                    "seconds": round(now - worker.started, 3)})
                pool.remove(worker)
            else:
                continue
            if progress:
                progress(outcomes[-1])
    for worker in pool:
        worker.process.stdin.close()
        worker.process.wait()
    return outcomes
