"""`python -m torch_metallib bench --scenario`: a model's start-up with a cold JIT, a warm
disk cache and an archive. Checked on the small scenario (llama-norms) with one round:
the document's shape, that each mode really took its kernels where it says (the archive
holds exactly the compiles the scenario asked for), that every mode computed the same
result, and the argument errors. No timing is asserted."""

import json
import os
import struct
import subprocess
import sys

import pytest
import torch

from torch_metallib.cli.bench import SCHEMA
from torch_metallib.cli.bench_scenario import MODES

PHASES = ("import torch", "import torch_metallib", "mlx.load", "first result", "steady-state run")
KEYS = {"schema", "date", "machine", "versions", "library", "kernels", "device", "repeat", "calls", "figures",
        "first_result", "ratios", "targets", "not_measured", "scenario"}


def bench(*args):
    return subprocess.run([sys.executable, "-m", "torch_metallib", "bench", *map(str, args)],
                          capture_output=True, text=True)


def run_scenario(folder, scenario, library, *more):
    run = bench(library, "--scenario", scenario, "--repeat", 1, "--json", folder / "out.json", "--plot", folder / "out.png",
                *more)
    assert run.returncode == 0, run.stderr
    return run.stdout, json.loads((folder / "out.json").read_text()), (folder / "out.png").read_bytes()


@pytest.fixture(scope="module")
def measured(mlx_path, tmp_path_factory):
    return run_scenario(tmp_path_factory.mktemp("scenario"), "llama-norms", mlx_path)


def check_modes(result):
    """Each mode took every kernel where it should, and all computed the same values."""
    scenario = result["scenario"]
    wanted = [c["kernel"] for c in scenario["compiles"]]
    where = {mode: [source for _, source in scenario["compiled"][mode]] for mode in MODES}
    assert sorted(kernel for kernel, _ in scenario["compiled"]["cold JIT"]) == sorted(wanted)
    assert where["cold JIT"] == ["compiled"] * len(wanted)
    assert where["warm disk cache"] == ["loaded from the disk cache"] * len(wanted)
    # The CPU says "loaded from archive PATH", CUDA "loaded from an archive".
    assert all(source.startswith("loaded from a") for source in where["archive"]), where["archive"]
    assert len(where["archive"]) == len(wanted) and result["not_measured"] == {}
    checksums = [value for mode in MODES for value in scenario["checksums"][mode]]
    assert checksums == pytest.approx([checksums[0]] * len(checksums), rel=1e-6)


def test_the_document_follows_the_schema(measured, mlx_path):
    _, result, _ = measured
    assert result["schema"] == SCHEMA and set(result) == KEYS
    assert result["device"] == "cpu" and result["repeat"] == 1 and result["calls"] == 0
    assert result["library"]["path"] == os.path.abspath(mlx_path)
    assert set(result["figures"]) == {f"{phase}, {mode}" for phase in PHASES for mode in MODES}
    for label, figure in result["figures"].items():
        assert figure["unit"] == "ms" and len(figure["samples"]) == 1, label
        assert figure["min"] == figure["median"] == figure["max"] > 0, label
    scenario = result["scenario"]
    assert scenario["name"] == "llama-norms" and scenario["distinct_kernels"] == 3
    assert result["kernels"] == ["rmsfloat32", "rope_float32", "block_softmax_float32"]
    rope = scenario["compiles"][1]
    assert rope == {"kernel": "rope_float32", "constants": {"forward": 1, "traditional": 0, "hs_transpose": 0},
                    "target": "cpu", "form": "threads"}
    assert scenario["archive"]["failed"] == 0 and scenario["archive"]["bytes"] > 0
    assert scenario["archive"]["targets"] == ["cpu:native"]
    assert len(scenario["threads"]) == 1 and scenario["threads"][0] >= 1  # every process ran with the same
    for name, approach in result["first_result"].items():
        assert list(approach["phases"]) == list(PHASES[:4]), name
        assert approach["total_ms"] == pytest.approx(sum(approach["phases"].values()))
    medians = {label: figure["median"] for label, figure in result["figures"].items()}
    assert result["ratios"]["first result: cold JIT / archive"] == pytest.approx(
        medians["first result, cold JIT"] / medians["first result, archive"])
    assert result["ratios"]["first result: archive / warm disk cache"] == pytest.approx(
        medians["first result, archive"] / medians["first result, warm disk cache"])
    (target,) = result["targets"].values()
    assert set(target) == {"value", "limit", "met"} and target["limit"] == 20


def test_each_mode_takes_its_kernels_where_it_says(measured):
    check_modes(measured[1])


def test_the_table_and_the_plot(measured):
    stdout, result, png = measured
    for label in list(result["figures"]) + list(result["ratios"]):
        assert label in stdout
    assert "scenario llama-norms" in stdout and "3 distinct compiles" in stdout
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 800 and height >= 200


@pytest.mark.slow
def test_the_llama_block(mlx_path, tmp_path):
    _, result, _ = run_scenario(tmp_path, "llama-block", mlx_path)
    kernels = {c["kernel"].split("_float")[0].split("float32")[0] for c in result["scenario"]["compiles"]}
    assert {"rms", "steel_gemm_fused_nn", "rope", "steel_attention", "sdpa_vector", "affine_qmv",
            "block_softmax"} <= kernels, kernels
    gemms = [c["constants"] for c in result["scenario"]["compiles"] if c["kernel"].startswith("steel_gemm")]
    assert sorted(g["align_M"] for g in gemms) == [0, 1]  # the prompt's 32 rows, the decoding step's one
    check_modes(result)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")
def test_the_small_scenario_on_the_gpu(mlx_path, tmp_path):
    _, result, _ = run_scenario(tmp_path, "llama-norms", mlx_path, "--device", "cuda")
    assert result["device"] == "cuda" and result["scenario"]["distinct_kernels"] == 3
    assert all(target.startswith("cuda:sm_") for target in result["scenario"]["archive"]["targets"])
    check_modes(result)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
@pytest.mark.parametrize("library", [None, "fixture"])
def test_cuda_without_a_gpu_is_refused(library, fixture_metallib, tmp_path):
    args = ["--scenario", "llama-norms"]
    if library:
        (tmp_path / "f.metallib").write_bytes(fixture_metallib)
        args = [tmp_path / "f.metallib"]
    run = bench(*args, "--device", "cuda", "--repeat", 1)
    assert run.returncode == 1 and "--device cuda, but torch.cuda.is_available() is False" in run.stderr, run.stderr


@pytest.mark.parametrize("args, message", [
    (["--scenario", "llama-norms", "--kernel", "rmsfloat32"], "expected no --kernel or --source with it"),
    (["--scenario", "llama-norms", "--device", "mps"], "expected --device cpu or --device cuda, got mps"),
    ([], "expected a .metallib to measure, or --scenario NAME; got neither"),
])
def test_arguments_that_do_not_fit_are_refused(args, message):
    run = bench(*args)
    assert run.returncode == 1 and message in run.stderr, run.stderr


def test_an_unknown_scenario_lists_the_known_ones():
    run = bench("--scenario", "llama")
    assert run.returncode == 2 and "llama-block" in run.stderr and "llama-norms" in run.stderr
