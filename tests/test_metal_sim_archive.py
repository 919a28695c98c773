"""Compiled pipelines kept across processes in a binary archive (csrc/mps/pipeline_archive.mm),
against the simulated Metal (`pytest -m metal_sim`).

The simulation models Apple's documented calls: an archive holds the functions added to it
(addComputePipelineFunctionsWithDescriptor:error:), serializeToURL:error: writes it,
newBinaryArchiveWithDescriptor:error: with a url reads it (an error for anything else),
and a pipeline made with FailOnBinaryArchiveMiss comes from an attached archive or is nil
with an error. Each case runs fresh processes sharing one cache folder, as programs
started one after another do. That Metal really skips the compile, and the time saved,
only a Mac shows (docs/backends/metal.md).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.metal_sim,
              pytest.mark.skipif(sys.platform == "darwin", reason="the simulated Metal is built on Linux only")]

TESTS = pathlib.Path(__file__).resolve().parent

# One process: the pipelines of function_constant_scale for each alpha given (their
# limits, through the Metal backend), then, with --run, one call through the simulated
# Metal (replayed on the CPU backend, bit-identical); prints what Metal did, as JSON.
CHILD = r"""
import json, sys
import torch
import torch_metallib as tm
import _conformance as conformance
from _metal_sim import native, simulated_metal
from torch_metallib.backends.mps_backend import MpsBackend

library = tm.load(open(sys.argv[1], "rb").read())
kernel = library["function_constant_scale"]
state = kernel._dispatch_state()
x, out = torch.randn(100), torch.zeros(100)
backend = MpsBackend(native())
alphas = [float(a) for a in sys.argv[2:] if a != "--run"]
limits = [backend.limits(kernel, state.spec.bind((x, out), {}, 100, None, {"use_bias": False, "alpha": a}, None))
          for a in alphas]
if "--run" in sys.argv:
    with simulated_metal(archive=True):
        conformance.check_fixture_function_constant_scale(library, False, alphas[0])
print(json.dumps({"counts": native().counts(), "archive": native().pipeline_archive_status(), "limits": limits}))
"""


@pytest.fixture
def run(tmp_path, fixture_metallib):
    """run(*alphas, **environment) -> what one fresh process reports (cache under tmp_path)."""
    library = tmp_path / "fixtures.metallib"
    library.write_bytes(fixture_metallib)

    def one_process(*alphas, **environment):
        env = dict(os.environ, TORCH_METALLIB_CACHE_DIR=str(tmp_path / "cache"),
                   PYTHONPATH=os.pathsep.join([str(TESTS), str(TESTS.parent)]))
        env.pop("TORCH_METALLIB_METAL_ARCHIVE", None)
        env.update(environment)
        done = subprocess.run([sys.executable, "-c", CHILD, str(library), *map(str, alphas)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    return one_process


def archives(tmp_path):
    return sorted((tmp_path / "cache" / "metal").glob("*")) if (tmp_path / "cache" / "metal").exists() else []


def test_first_process_compiles_and_writes_second_loads_without_compiling(run, tmp_path):
    first = run(0.5)
    assert first["counts"]["pipelines"] == 1 and first["counts"]["archived_pipelines"] == 0
    assert first["counts"]["archive_misses"] == 1 and first["counts"]["archive_additions"] == 1
    path = pathlib.Path(first["archive"]["path"])
    assert path.parent == tmp_path / "cache" / "metal" and path.name.startswith("Simulated_GPU-")
    assert path.suffix == ".binarchive" and first["archive"]["compiled"] == 1
    # Written at exit (pending until then), in one file: no temporary left beside it.
    assert first["archive"]["pending"] and archives(tmp_path) == [path]

    second = run(0.5, "--run")
    assert second["counts"]["archives_read"] == 1
    assert second["counts"]["pipelines"] == 0, "the second process compiled a pipeline the archive holds"
    # Two Metal libraries (the limits', the call's): both take the pipeline from the archive.
    assert second["counts"]["archived_pipelines"] == 2 and second["archive"]["hits"] == 2
    assert second["limits"] == first["limits"]
    assert not second["archive"]["pending"]  # nothing added: the file is not written again


def test_other_constant_values_miss_and_are_added(run):
    run(0.5)
    second = run(0.5, 0.75)
    assert (second["archive"]["hits"], second["archive"]["compiled"]) == (1, 1)
    assert second["counts"]["pipelines"] == 1 and second["counts"]["archive_misses"] == 1
    third = run(0.75, 0.5)
    assert (third["archive"]["hits"], third["archive"]["compiled"]) == (2, 0)
    assert third["counts"]["pipelines"] == 0


@pytest.mark.parametrize("damage", [b"not an archive\n", b"", b"SIM-MTLBINARYARCHIVE-1\n\xff\xfe\n"])
def test_a_damaged_archive_is_discarded_and_rewritten(run, tmp_path, damage):
    path = pathlib.Path(run(0.5)["archive"]["path"])
    path.write_bytes(damage)
    after = run(0.5, "--run")  # the call itself is still right (bit-identical to the CPU)
    assert after["archive"]["discarded"] == 1 and after["counts"]["archives_read"] == 0
    # Compiled once; the call's own Metal library then finds it in the archive made afresh.
    assert after["counts"]["pipelines"] == 1 and after["archive"]["compiled"] == 1
    assert after["archive"]["hits"] == 1
    again = run(0.5)
    assert again["archive"]["discarded"] == 0 and again["archive"]["hits"] == 1
    assert again["counts"]["pipelines"] == 0


@pytest.mark.parametrize("knob", ["TORCH_METALLIB_METAL_ARCHIVE", "TORCH_METALLIB_CACHE"])
def test_the_knob_turns_it_off(run, tmp_path, knob):
    for _ in range(2):
        off = run(0.5, **{knob: "0"})
        assert off["counts"]["pipelines"] == 1 and off["archive"]["path"] == ""
        assert off["counts"]["archive_misses"] == 0 and off["counts"]["archive_additions"] == 0
    assert archives(tmp_path) == []
