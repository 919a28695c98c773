"""Shared test data: the Apple-built MLX corpus and the project's own packed fixtures."""

import os
import pathlib
import struct
import sys

import pytest

import torch_metallib as tm
from torch_metallib.cache.corpus import mlx_metallib_path

# The shared helper modules (tests/_*.py) hold most checks' asserts: pytest rewrites them as it
# does the tests', so a failure shows the values compared. Registered before any is imported.
pytest.register_assert_rewrite(*sorted(p.stem for p in pathlib.Path(__file__).parent.glob("_*.py")))

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
import pack_fixtures as fixtures_pack  # noqa: E402  (tests/fixtures/pack_fixtures.py)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(message: str):
    """A test's input is missing: in CI, which provides every one, the run fails; elsewhere
    (no network, no CUDA toolkit) the test is skipped."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def mlx_path() -> str:
    """Path of Apple-built mlx.metallib (downloaded once into the cache). In CI a missing
    corpus fails the run; locally, without network, the tests that need it are skipped.
    $TORCH_METALLIB_TEST_MLX names another file to use instead (a subset of it, on a GPU
    machine without network, for tests/test_cuda.py)."""
    if os.environ.get("TORCH_METALLIB_TEST_MLX"):
        return os.environ["TORCH_METALLIB_TEST_MLX"]
    try:
        return mlx_metallib_path()
    except Exception as error:  # noqa: BLE001 - any fetch failure
        unavailable(f"the MLX corpus could not be fetched: {error}")


@pytest.fixture(scope="session")
def torch_libraries() -> dict:
    """{"macos14": path, "macos26": path}: the two Apple-built libraries of PyTorch's own
    Metal kernels in torch 2.13's macOS wheel (downloaded once into the cache). In CI a
    missing corpus fails the run; locally, without network, the tests that need it skip."""
    from torch_metallib.cache.torch_corpus import torch_metallib_paths
    try:
        return torch_metallib_paths()
    except Exception as error:  # noqa: BLE001 - any fetch failure
        unavailable(f"torch's metallibs could not be fetched: {error}")


@pytest.fixture(scope="module")
def defined(mlx_path) -> dict:
    """torch_metallib.mlx's operators, defined on the MLX corpus."""
    from torch_metallib import mlx
    return mlx.load(mlx_path)


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches emptied before and after the test, so it compiles afresh."""
    import torch
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def mlx_bytes(mlx_path) -> bytes:
    with open(mlx_path, "rb") as file:
        return file.read()


@pytest.fixture(scope="session")
def mlx_lib(mlx_path) -> tm.Library:
    return tm.load(mlx_path)


fixture_bitcode = fixtures_pack.bitcode


def raw_bitcode(bitcode: bytes) -> bytes:
    """The bitcode inside a Darwin wrapper (decoded here independently of the reader)."""
    magic, _version, offset, size, _cpu = struct.unpack_from("<5I", bitcode)
    assert magic == 0x0B17C0DE
    return bitcode[offset:offset + size]


FIXTURE_KERNELS = fixtures_pack.KERNELS
FIXTURE_CONSTANTS = fixtures_pack.CONSTANTS


@pytest.fixture(scope="session")
def fixture_sources():
    return fixtures_pack.sources()


@pytest.fixture(scope="session")
def fixture_metallib(fixture_sources) -> bytes:
    """The project's fixture kernels packed by the writer."""
    return tm.pack(fixture_sources)


@pytest.fixture(scope="module")
def fixtures_lib(fixture_metallib) -> tm.Library:
    """The fixture kernels loaded (per test module, as each module had its own)."""
    return tm.load(fixture_metallib)


@pytest.fixture(scope="module")
def fixtures(fixtures_lib) -> tm.Library:
    """The same library, by the name test_cpu_cooperative's tests take it."""
    return fixtures_lib


@pytest.fixture(scope="session")
def mlx_ops(mlx_lib) -> dict:
    """The example operators on MLX kernels (tests/_ops_examples.py), defined once."""
    from _ops_examples import define_mlx_examples
    return define_mlx_examples(mlx_lib)


@pytest.fixture(scope="session")
def fixture_ops(fixture_metallib) -> dict:
    """The example operators on the project's fixture kernels, defined once."""
    from _ops_examples import define_fixture_examples
    return define_fixture_examples(tm.load(fixture_metallib))


@pytest.fixture(scope="module")
def mlx002() -> tm.Library:
    """MLX 0.0.2's library from the public corpus subset: gather and scatter kernels whose
    index arrays come in an argument buffer (tests/_argument_buffers.py)."""
    from _public_corpus import subset_files
    return tm.load(next(p for p in subset_files() if p.name == "mlx-0.0.2-mlx.metallib"))
