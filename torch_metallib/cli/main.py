"""Command line: ``python -m torch_metallib {inspect,census,corpus,pack,lint,bench,cuda-coverage,doctor,precompile} ...``
(also installed as the ``torch-metallib`` console script)."""

import argparse
import os
import sys

from . import bench as _bench
from . import census as _census
from . import cuda_coverage as _cuda_coverage
from . import doctor as _doctor
from . import inspect as _inspect
from . import lint as _lint
from . import pack as _pack
from . import precompile as _precompile
from . import program_name
from ..errors import TorchMetallibError

__all__ = ["main"]


def _add_corpus_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "corpus", help="download the Apple-built MLX reference metallib; print its path",
        description="Fetch mlx.metallib (17,248 Apple-compiled kernels) from the mlx-metal "
                    "macOS wheel on PyPI into the cache, once, and print its path.")
    parser.add_argument("--torch", action="store_true",
                        help="instead, fetch the two metallibs of PyTorch's macOS wheel (12,998 "
                             "kernels each, built for macOS 14 and 26) and print their paths")
    parser.set_defaults(run=_run_corpus)


def _run_corpus(args) -> int:
    from ..cache.corpus import mlx_metallib_path
    from ..cache.torch_corpus import torch_metallib_paths

    if args.torch:
        for path in torch_metallib_paths().values():
            print(path)
    else:
        print(mlx_metallib_path())
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=program_name())
    subparsers = parser.add_subparsers(dest="command", required=True)
    _inspect.add_parser(subparsers)
    _census.add_parser(subparsers)
    _add_corpus_parser(subparsers)
    _pack.add_parser(subparsers)
    _lint.add_parser(subparsers)
    _bench.add_parser(subparsers)
    _cuda_coverage.add_parser(subparsers)
    _doctor.add_parser(subparsers)
    _precompile.add_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (TorchMetallibError, KeyError, OSError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"error: {message}", file=sys.stderr)
        return 1

