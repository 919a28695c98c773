"""Start-up figures of the reference corpus, mlx.metallib (146,876,416 bytes, 17,248
kernels): ``python -m torch_metallib bench`` on it, with the same measuring code
(torch_metallib/cli/bench.py), so README's table and a user's own run agree.

Usage: python benchmarks/load.py [--repeat N] [--json OUT] [--plot OUT.png] [--markdown]

Every figure is taken in fresh processes; targets: load(bytes) at most 1 ms median
and at least 30x faster than a plain Python reading of the function list measured in the
same run; load(path) adds at most 5 MB of resident memory.
"""

import sys

from torch_metallib.cache.corpus import mlx_metallib_path
from torch_metallib.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", mlx_metallib_path(), "--kernel", "vv_Addfloat32", *sys.argv[1:]]))
