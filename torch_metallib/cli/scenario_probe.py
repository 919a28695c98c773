"""One fresh process of ``bench --scenario``: imports, ``mlx.load()``, then the scenario's
first result, timed; prints one JSON object.

Run as a script by its path (``python scenario_probe.py SCENARIO DEVICE LIBRARY RECORD``) so
that nothing is imported before the imports are timed. The figures (ms): ``import torch``,
``import torch_metallib``, ``mlx.load`` (the library and its operators), ``first result``
(the scenario's first run, to its values on the host) and ``steady-state run`` (the median
of three more). ``compiled`` lists each kernel the process compiled or loaded, with where
from (the compile log), ``threads`` torch's thread count (``OMP_NUM_THREADS`` sets it).
With RECORD = 1 the process also lists, under ``requests``, every compile request it made,
as the archive lookups a compile makes first: (kernel, constants by name, target); the
parent builds the archive of exactly those.
"""

import json
import logging
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Run by path, Python put this folder first on sys.path, where cli/inspect.py would shadow
# the standard library's inspect that torch imports.
if sys.path and os.path.abspath(sys.path[0] or ".") == HERE:
    del sys.path[0]

STEADY_RUNS = 3


def since(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


class CompileLog(logging.Handler):
    """The backends' INFO line per kernel compiled or loaded (``cpu: NAME: SOURCE ...``)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.kernels = []

    def emit(self, record):
        if record.msg.startswith(("cpu: ", "cuda: ")) and len(record.args) >= 2:
            self.kernels.append([record.args[0], record.args[1]])


class Recorder:
    """Stands in for an archive that has nothing: each compile looks its kernel up in the
    library's archives first, so every lookup is one compile request."""

    description = "bench's recorder"

    def __init__(self, target):
        self.targets, self.requests = [target], []

    def lookup(self, target, function_hash, constants_text, form):
        self.requests.append((target, function_hash, constants_text, form))
        return None


def requests_by_name(library, requests) -> list:
    import ast

    names = {}
    wanted = {request[1] for request in requests}
    for name in library.function_names:
        function = library[name]
        if function.hash in wanted:
            names[function.hash] = function
    out = []
    for target, function_hash, constants_text, form in requests:
        function = names[function_hash]
        by_index = {constant.index: constant.name for constant in function.function_constants}
        constants = {by_index[index]: value for index, value in ast.literal_eval(constants_text)}
        # The recorder's CPU target is a stand-in: the CPU level is the archive builder's choice.
        out.append({"kernel": function.name, "constants": constants,
                    "target": "cpu" if target.startswith("cpu:") else target, "form": form})
    return out


def main(scenario: str, device: str, library_path: str, record: bool) -> dict:
    out = {}
    start = time.perf_counter()
    import torch

    out["import torch"] = since(start)
    start = time.perf_counter()
    import torch_metallib  # noqa: F401
    from torch_metallib import mlx

    out["import torch_metallib"] = since(start)
    log = CompileLog()
    logger = logging.getLogger("torch_metallib")
    logger.addHandler(log)
    logger.setLevel(logging.INFO)
    from torch_metallib.cli.bench_scenarios import SCENARIOS

    run = SCENARIOS[scenario](device)  # inputs and weights: torch only, untimed

    def finished(result):
        if device == "cuda":
            torch.cuda.synchronize()
        return result.cpu()

    start = time.perf_counter()
    mlx.load(library_path or None)
    out["mlx.load"] = since(start)
    recorder = None
    if record:
        from torch_metallib.cache.archive import Target
        from torch_metallib.mlx._library import library

        recorder = Recorder(Target("cpu:x86-64", "", ()))
        library()._archives = (recorder,) + library()._archives
    start = time.perf_counter()
    first = finished(run())
    out["first result"] = since(start)
    samples = []
    for _ in range(STEADY_RUNS):
        start = time.perf_counter()
        finished(run())
        samples.append(since(start))
    out["steady-state run"] = statistics.median(samples)
    out["compiled"] = log.kernels
    out["threads"] = torch.get_num_threads()
    values = first.double().flatten()  # weighted: a softmax's plain sum is its row count
    out["checksum"] = float((values * torch.arange(1, values.numel() + 1, dtype=torch.float64)).sum())
    if recorder is not None:
        from torch_metallib.mlx._library import library

        out["requests"] = requests_by_name(library(), recorder.requests)
    return out


if __name__ == "__main__":
    scenario, device, library_path, record = sys.argv[1:5]
    print(json.dumps(main(scenario, device, library_path, record == "1")))
