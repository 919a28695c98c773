"""`python -m torch_metallib bench`: the JSON document's schema, a readable PNG, clear errors
for files it cannot measure, and the baseline it compares against reading what load reads.
No timing is asserted: the figures are measurements, checked for shape only."""

import json
import struct
import subprocess
import sys

import pytest

import torch_metallib as tm
from torch_metallib.cli import bench_report
from torch_metallib.cli.bench import SCHEMA
from torch_metallib.cli.function_list_baseline import parse_function_list

REPEAT = 2


def bench(*args):
    return subprocess.run([sys.executable, "-m", "torch_metallib", "bench", *map(str, args)],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def fixture_path(fixture_metallib, tmp_path_factory):
    path = tmp_path_factory.mktemp("library") / "fixtures.metallib"
    path.write_bytes(fixture_metallib)
    return path


@pytest.fixture(scope="module")
def measured(fixture_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    run = bench(fixture_path, "--repeat", REPEAT, "--calls", 3, "--json", folder / "out.json",
                "--plot", folder / "out.png")
    assert run.returncode == 0, run.stderr
    return run.stdout, json.loads((folder / "out.json").read_text()), (folder / "out.png").read_bytes()


@pytest.mark.slow
def test_json_follows_the_schema(measured, fixture_path):
    _, result, _ = measured
    assert result["schema"] == SCHEMA
    assert set(result) == {"schema", "date", "machine", "versions", "library", "kernels", "device", "repeat",
                           "calls", "figures", "first_result", "ratios", "targets", "not_measured"}
    assert result["library"]["functions"] == len(tm.load(fixture_path))
    assert result["library"]["bytes"] == fixture_path.stat().st_size
    assert result["kernels"] == ["vector_add_float"] and result["device"] == "cpu" and result["repeat"] == REPEAT
    assert set(result["versions"]) == {"python", "torch", "torch_metallib", "llvmlite"}
    kernel = " (vector_add_float)"
    expected = {"python function list", "import torch", "import torch_metallib", "load(bytes)", "load(path)",
                "memory added by load(bytes)", "memory added by load(path)", "function list",
                "first reflection" + kernel, "first call, cold cache" + kernel, "first call, warm cache" + kernel,
                "steady-state call" + kernel}
    assert set(result["figures"]) == expected
    for label, figure in result["figures"].items():
        assert figure["unit"] == ("MB" if label.startswith("memory") else "ms")
        # Pooled over the probes that take them: imports in bytes, cold and warm probes;
        # load(path), the function list and the first reflection in cold and warm ones.
        once = ("python", "load(bytes)", "memory added by load(bytes)", "first call", "steady")
        per_round = 3 if label.startswith("import") else 1 if label.startswith(once) else 2
        assert len(figure["samples"]) == per_round * REPEAT, label
        assert figure["min"] <= figure["p10"] <= figure["median"] <= figure["p90"] <= figure["max"], label
        if figure["unit"] == "ms":
            assert figure["min"] > 0, label
    for approach in result["first_result"].values():
        assert approach["total_ms"] == pytest.approx(sum(approach["phases"].values()))
    medians = {label: figure["median"] for label, figure in result["figures"].items()}
    assert result["ratios"]["python function list / load(bytes)"] == pytest.approx(
        medians["python function list"] / medians["load(bytes)"])
    assert all(set(target) == {"value", "limit", "met"} for target in result["targets"].values())
    if not result["device"] == "mps":
        assert "needs an MPS device" in result["not_measured"]["torch.mps.compile_shader"]


def test_stdout_table_lists_every_figure(measured):
    stdout, result, _ = measured
    for label in result["figures"]:
        assert label in stdout
    assert "not measured:" in stdout


def test_plot_is_a_png_a_person_can_read(measured):
    _, _, png = measured
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 800 and height >= 200
    import matplotlib.image
    import io

    pixels = matplotlib.image.imread(io.BytesIO(png))
    assert pixels.shape[:2] == (height, width) and pixels.std() > 0.05  # not a blank picture


def test_missing_file_is_a_clear_error(tmp_path):
    run = bench(tmp_path / "nowhere.metallib")
    assert run.returncode == 1 and "error: bench:" in run.stderr and "no such file" in run.stderr


def test_a_file_that_is_not_a_metallib_is_refused_with_its_offset(tmp_path):
    path = tmp_path / "notes.metallib"
    path.write_bytes(b"these are not the bytes you are looking for" * 4)
    run = bench(path)
    assert run.returncode == 1 and "magic" in run.stderr and "not a .metallib" in run.stderr, run.stderr


def test_an_unknown_kernel_is_named_with_the_closest(fixture_path):
    run = bench(fixture_path, "--kernel", "vector_add_flaot")
    assert run.returncode == 1 and "vector_add_float" in run.stderr, run.stderr


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(tm.TorchMetallibError, match="pip install matplotlib"):
        bench_report.require_matplotlib()


def test_the_baseline_reads_what_load_reads(mlx_bytes):
    data = mlx_bytes
    parsed, lib = parse_function_list(data), tm.load(data)
    assert tuple(parsed) == lib.function_names
    kernel = lib.vv_Addfloat32
    fields = parsed["vv_Addfloat32"]
    assert fields["hash"].hex() == kernel.hash and fields["module_size"] == kernel.module_size
    assert fields["versions"] == kernel.air_version + kernel.language_version


def test_on_mps_a_warm_probe_without_the_pipeline_archive_is_planned_and_reported():
    """On mps the warm probe takes pipelines from the binary archive; the unarchived one
    (TORCH_METALLIB_METAL_ARCHIVE=0) has Metal compile them, so the first result shows both."""
    from torch_metallib.cli import bench

    assert ("unarchived", "k") in bench._plan(["k"], None, "mps")[0]
    assert not any(kind == "unarchived" for kind, _ in bench._plan(["k"], None, "cpu")[0])
    figures = {label: {"median": value} for label, value in {
        "import torch": 700.0, "import torch_metallib": 50.0, "load(path)": 1.0, "first reflection (k)": 2.0,
        "first call, warm cache (k)": 3.0, "first call, cold cache (k)": 30.0,
        "first call, unarchived cache (k)": 20.0}.items()}
    first = bench._first_result(figures, ["k"])
    assert first["torch_metallib, warm cache, pipeline archive off"]["phases"]["first call"] == 20.0
    assert first["torch_metallib, warm cache"]["phases"]["first call"] == 3.0
