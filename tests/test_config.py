"""The configuration knobs (torch_metallib/config.py), their documentation, the
``torch_metallib`` logger and IR dumps (torch_metallib/diagnostics.py)."""

import logging
import os
import pathlib
import re
import subprocess
import sys

import llvmlite.binding as llvm
import pytest
import torch

import torch_metallib as tm
from torch_metallib import config, diagnostics
from torch_metallib.backends.cpu import jit as cpu_jit
from torch_metallib.cache import disk_cache

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
PACKAGE = pathlib.Path(tm.__file__).resolve().parent


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty disk cache and nothing compiled in memory: the next call compiles."""
    monkeypatch.setenv("TORCH_METALLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCH_METALLIB_CACHE", raising=False)
    monkeypatch.delenv("TORCH_METALLIB_LOG", raising=False)
    monkeypatch.delenv("TORCH_METALLIB_DUMP_IR", raising=False)
    monkeypatch.setattr(cpu_jit, "_compiled", {})
    monkeypatch.setattr(disk_cache, "_warned", set())
    return tmp_path


def add(fixture_metallib):
    """vector_add_float from a freshly loaded library (so nothing is prepared yet)."""
    lib = tm.load(fixture_metallib)
    a, b, out = torch.arange(64.0), torch.ones(64), torch.empty(64)
    lib.vector_add_float(a, b, out, threads=64)
    assert torch.equal(out, a + b)


def threadgroup_sum(fixture_metallib):
    """threadgroup_sum_float, a kernel whose threads meet at barriers."""
    lib = tm.load(fixture_metallib)
    x = torch.ones(256)
    out = torch.zeros(4)
    lib.threadgroup_sum_float(x, out, threads=256, group_size=64, threadgroup_memory={0: 64 * 4})


# -- the knobs --------------------------------------------------------------------------

@pytest.mark.parametrize("text,value", [("1", True), ("true", True), ("Yes", True), (" ON ", True),
                                        ("0", False), ("false", False), ("NO", False), ("off", False)])
def test_booleans_follow_one_rule(monkeypatch, text, value):
    for knob in [k for k in config.KNOBS.values() if isinstance(k, config.BoolKnob)]:
        monkeypatch.setenv(knob.name, text)
        assert knob.get() is value


@pytest.mark.parametrize("text", ["", "  "])
def test_an_empty_variable_is_the_default(monkeypatch, text):
    for knob in config.KNOBS.values():
        monkeypatch.setenv(knob.name, text)
        assert knob.get() == knob.default
        monkeypatch.delenv(knob.name)
        assert knob.get() == knob.default


@pytest.mark.parametrize("text", ["2", "maybe", "enabled", "tru"])
def test_other_boolean_values_raise_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv("TORCH_METALLIB_CACHE", text)
    with pytest.raises(config.ConfigurationError) as raised:
        disk_cache.cache_directory("jit")
    message = str(raised.value)
    assert "TORCH_METALLIB_CACHE" in message and repr(text) in message
    assert all(word in message for word in config.TRUE + config.FALSE)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, tm.TorchMetallibError)


def test_knobs_are_read_when_used(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_METALLIB_CACHE_DIR", str(tmp_path / "a"))
    assert disk_cache.cache_directory("jit") == str(tmp_path / "a" / "jit")
    monkeypatch.setenv("TORCH_METALLIB_CACHE_DIR", str(tmp_path / "b"))
    assert disk_cache.cache_directory("jit") == str(tmp_path / "b" / "jit")
    monkeypatch.setenv("TORCH_METALLIB_CACHE", "off")
    assert disk_cache.cache_directory("jit") is None


def test_choices_are_checked(monkeypatch):
    monkeypatch.setenv("TORCH_METALLIB_LOG", "DEBUG")
    assert config.LOG.get() == "debug"
    monkeypatch.setenv("TORCH_METALLIB_LOG", "loud")
    with pytest.raises(config.ConfigurationError, match="TORCH_METALLIB_LOG='loud': expected one of debug, info"):
        config.LOG.get()


def test_every_variable_the_package_reads_is_a_knob():
    """Only config.py reads the environment (the benchmark command passes it on to children)."""
    readers = re.compile(r"os\.environ|os\.getenv|getenv\(")
    found = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in ("config.py", "cli/bench.py", "cli/bench_scenario.py"):
            continue
        found += [f"{relative}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1) if readers.search(line)]
    assert found == []
    named = set(re.findall(r"\b(?:TORCH_METALLIB_[A-Z_]+|TM_PUBLIC_CORPUS|XDG_CACHE_HOME|CUDA_HOME|CUDA_PATH|PTXAS)\b",
                           "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))))
    assert named - set(config.KNOBS) == set()


def test_the_documentation_lists_exactly_the_knobs():
    text = DOCS.read_text()
    begin, end = "<!-- knobs: begin -->\n", "<!-- knobs: end -->"
    table = text[text.index(begin) + len(begin):text.index(end)]
    assert table.strip() == config.markdown_table().strip(), (
        "docs/configuration.md's table is out of date: replace it with the output of "
        "python -c 'from torch_metallib import config; print(config.markdown_table(), end=\"\")'")
    listed = re.findall(r"^\| `([A-Z_]+)` \|", table, re.M)
    assert listed == list(config.KNOBS)


# -- the logger -------------------------------------------------------------------------

def test_compiles_and_cache_lookups_are_logged(fresh, fixture_metallib, caplog):
    caplog.set_level(logging.DEBUG, logger="torch_metallib")
    add(fixture_metallib)
    messages = [r.getMessage() for r in caplog.records if r.name == "torch_metallib"]
    assert any(re.fullmatch(r"cpu: vector_add_float: compiled \(as threads\) in \d+\.\d{3} s", m) for m in messages)
    assert any(m.startswith("disk cache miss: ") and m.endswith(" ms)") for m in messages)

    caplog.clear()
    cpu_jit._compiled.clear()
    add(fixture_metallib)
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "torch_metallib"]
    assert any(level == logging.INFO and "vector_add_float: loaded from the disk cache" in m for level, m in messages)
    assert any(level == logging.DEBUG and m.startswith("disk cache hit: ") for level, m in messages)


def test_the_logger_is_silent_by_default(fixture_metallib, tmp_path):
    script = ("import sys, torch, torch_metallib as tm\n"
              "sys.path.insert(0, sys.argv[1])\n"
              "import pack_fixtures\n"
              "lib = tm.load(tm.pack(pack_fixtures.sources()))\n"
              "out = torch.empty(8)\n"
              "lib.vector_add_float(torch.ones(8), torch.ones(8), out, threads=8)\n")
    fixtures = str(pathlib.Path(__file__).parent / "fixtures")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_METALLIB_LOG", "TORCH_METALLIB_CACHE")}
    env["TORCH_METALLIB_CACHE_DIR"] = str(tmp_path / "cache")
    quiet = subprocess.run([sys.executable, "-c", script, fixtures], capture_output=True, text=True, env=env,
                           timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert "torch_metallib" not in quiet.stderr
    env["TORCH_METALLIB_LOG"] = "debug"
    loud = subprocess.run([sys.executable, "-c", script, fixtures], capture_output=True, text=True, env=env,
                          timeout=300)
    assert loud.returncode == 0, loud.stderr
    assert "torch_metallib INFO: cpu: vector_add_float: loaded from the disk cache" in loud.stderr
    assert "torch_metallib DEBUG: disk cache hit: " in loud.stderr


def test_the_log_variable_installs_and_removes_a_handler(monkeypatch):
    monkeypatch.setenv("TORCH_METALLIB_LOG", "info")
    logger = diagnostics.get_logger()
    try:
        assert logger.level == logging.INFO and diagnostics._handler in logger.handlers
    finally:
        monkeypatch.delenv("TORCH_METALLIB_LOG")
        logger = diagnostics.get_logger()
    assert logger.level == logging.NOTSET and diagnostics._handler is None
    assert [type(h) for h in logger.handlers] == [logging.NullHandler]


# -- IR dumps ---------------------------------------------------------------------------

def _dumped(root: pathlib.Path, kernel: str) -> pathlib.Path:
    (folder,) = [p for p in root.iterdir() if p.name.startswith(kernel + "-")]
    assert re.fullmatch(re.escape(kernel) + r"-[0-9a-f]{16}", folder.name)
    return folder


def _parses(path: pathlib.Path) -> None:
    module = llvm.parse_assembly(path.read_text(), context=llvm.create_context())
    module.verify()


def test_dump_writes_each_stage_of_a_cpu_kernel(fresh, fixture_metallib, monkeypatch):
    root = fresh / "dump"
    add(fixture_metallib)  # now in the disk cache: the dump compiles it again all the same
    cpu_jit._compiled.clear()
    monkeypatch.setenv("TORCH_METALLIB_DUMP_IR", str(root))
    add(fixture_metallib)
    folder = _dumped(root, "vector_add_float")
    assert sorted(p.name for p in folder.iterdir()) == ["air.ll", "lowered.ll", "optimized.ll"]
    for stage in folder.iterdir():
        _parses(stage)
    assert "@vector_add_float(" in (folder / "air.ll").read_text()
    assert "__tm_launch_" not in (folder / "air.ll").read_text()
    assert "__tm_launch_" in (folder / "lowered.ll").read_text()
    assert "__tm_launch_" in (folder / "optimized.ll").read_text()


def test_dump_of_a_cooperative_kernel(fresh, fixture_metallib, monkeypatch):
    root = fresh / "dump"
    monkeypatch.setenv("TORCH_METALLIB_DUMP_IR", str(root))
    threadgroup_sum(fixture_metallib)
    folder = _dumped(root, "threadgroup_sum_float")
    names = sorted(p.name for p in folder.iterdir())
    assert names[:2] == ["air.ll", "lanes.ll"] or names[:2] == ["air.ll", "coroutines.ll"]
    assert {"lowered.ll", "optimized.ll"} <= set(names)
    for stage in folder.iterdir():
        _parses(stage)


def test_nothing_is_dumped_without_the_variable(fresh, fixture_metallib):
    add(fixture_metallib)
    assert not (fresh / "dump").exists()
    assert sorted(os.listdir(fresh)) == ["cache"]


def test_dump_writes_each_stage_of_a_cuda_kernel(fresh, fixture_metallib, monkeypatch):
    """The CUDA lowering runs without a GPU (PTX is made by llvmlite): its stages and the PTX."""
    from torch_metallib.backends.cuda.backend import CudaKernel

    root = fresh / "dump"
    monkeypatch.setenv("TORCH_METALLIB_DUMP_IR", str(root))
    ptx = CudaKernel(tm.load(fixture_metallib).vector_add_float, (), grid_only=True).ptx("sm_80")
    folder = _dumped(root, "vector_add_float")
    assert sorted(p.name for p in folder.iterdir()) == ["air.ll", "kernel.ptx", "lowered.ll", "optimized.ll"]
    for stage in ("air.ll", "lowered.ll", "optimized.ll"):
        _parses(folder / stage)
    assert (folder / "kernel.ptx").read_text() == ptx and ".entry " in ptx
    assert "nvptx64" in (folder / "lowered.ll").read_text()


def test_a_dump_keeps_only_the_compile_that_was_kept(fresh, fixture_metallib, monkeypatch):
    """Stages of an earlier compile (or of lane loops the backend gave up) do not stay."""
    root = fresh / "dump"
    monkeypatch.setenv("TORCH_METALLIB_DUMP_IR", str(root))
    add(fixture_metallib)
    folder = _dumped(root, "vector_add_float")
    (folder / "lanes.ll").write_text("stale")
    cpu_jit._compiled.clear()
    add(fixture_metallib)
    assert sorted(p.name for p in folder.iterdir()) == ["air.ll", "lowered.ll", "optimized.ll"]
