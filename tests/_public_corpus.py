"""The public-corpus subset (tests/corpora/fetch_public.sh; .ci/run fetches it): where it is,
what CI fetches, and each producer's group-size convention. Shared by the tests that read it."""

import os
import pathlib

from conftest import unavailable

CORPUS = pathlib.Path(os.environ.get("TM_PUBLIC_CORPUS",
                                     pathlib.Path.home() / ".cache/torch_metallib/public-corpus"))
# What CI fetches (grep -E over the output names): both size conventions, AIR 2.4 to 2.8,
# vertex and fragment functions, argument buffers, metallibs embedded in .so files. Keep it in sync with .ci/run.
PUBLIC_SUBSET = "^(executorch|gpt4all|metal-|metalcore|metalq|psych|penny|sk|diff|mlx-lstsq|mlx-0\\.0\\.2-mlx$)"
# file name prefix -> the convention that producer's toolchain writes (read off the bytes:
# an ENDT-only metadata group says 8 in the current convention, 4 in the older one).
CONVENTIONS = {
    "diffusion-rs": "current", "executorch-1.3.1": "older", "executorch-1.4.1": "current",
    "executorch-1.5.1": "current", "gpt4all": "older", "metal-flash-sdpa": "older",
    "metal-graph": "older", "metal-linalg": "older", "metalcore": "older", "metalq": "older",
    "pennylane": "older", "psychmetal": "current", "skmetal": "older",
    "mlx-lstsq": "current", "mlx-0.0.2-mlx.": "older",  # argument buffers (gather)
}


def subset_files():
    files = sorted(p for p in CORPUS.glob("*.metallib")
                   if any(p.name.startswith(prefix) for prefix in CONVENTIONS))
    if len(files) < 28:
        message = (f"public corpus subset: expected 28 files in {CORPUS}, found {len(files)}. "
                   f"Fetch it: bash tests/corpora/fetch_public.sh '{PUBLIC_SUBSET}'")
        unavailable(message)
    return files


def producer(path: pathlib.Path) -> str:
    return next(prefix for prefix in CONVENTIONS if path.name.startswith(prefix))


MAC26 = "mlx-metal-0.32.4-mlx_mac26.metallib"             # .ci/run fetches it


def mac26_path() -> pathlib.Path:
    """The macOS 26 build of MLX 0.32.4 (Xcode 26's simdgroup_matrix forms), in the corpus."""
    path = CORPUS / MAC26
    if not path.exists():
        unavailable(f"{path} is missing. Fetch it: bash tests/corpora/fetch_public.sh '^mlx-metal-0\\.32\\.4-mlx_mac26'")
    return path
