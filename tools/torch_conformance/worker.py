"""One child process of the conformance runner: reads kernel names, answers JSON lines."""

import json
import sys
import time
import warnings

import torch

import torch_metallib as tm

from . import families


def main(library_path: str, device: str) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    library = tm.load(library_path)
    context = families.Context(library, device)
    for line in sys.stdin:
        name = line.strip()
        started = time.monotonic()
        outcome, detail = families.check(context, name)
        print(json.dumps({"kernel": name, "outcome": outcome, "detail": detail[:1000],
                          "seconds": round(time.monotonic() - started, 3)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
