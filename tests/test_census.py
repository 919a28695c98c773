"""The intrinsic census: every air.* intrinsic variant the compute kernels of mlx.metallib,
the public corpus subset and PyTorch's own two libraries can call is implemented by the CPU
backend, and the census reports what a library's kernels really call."""

import json
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import torch_metallib as tm
from torch_metallib.cli.census import census
from _mojo import mojo_modules
from _public_corpus import subset_files
from tests import _air_modules as air

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


@pytest.mark.slow
def test_every_variant_in_the_reference_and_public_corpora_is_implemented(mlx_path):
    result = census([mlx_path] + [str(p) for p in subset_files()])
    missing = [f"{v.name} {v.ret} ({', '.join(v.params)}) e.g. {v.example}" for v in result["variants"]
               if not v.implemented]
    assert not missing, "\n".join(missing)
    assert not result["errors"], result["errors"]
    assert result["kernels"] > 30000 and len(result["variants"]) > 300
    names = {v.name for v in result["variants"]}
    # Variants the intrinsic-variant defects were in, present in these corpora and now implemented.
    assert {"air.atomic.global.cmpxchg.weak.i32", "air.all.v2i1", "air.fmax3.f16", "air.popcount.i32",
            "air.simd_vote_all.i64", "air.simdgroup_matrix_8x8_init_diag.v64f32.f32"} <= names


@pytest.mark.slow
def test_every_variant_of_pytorchs_own_kernels_is_implemented(torch_libraries):
    """Both libraries of torch 2.13's macOS wheel, whole declarations compared: Metal's 64-bit
    atomic min/max as PyTorch declares them (returning void) and air.sincos included."""
    result = census([torch_libraries["macos14"], torch_libraries["macos26"]])
    missing = [f"{v.name} {v.ret} ({', '.join(v.params)}) e.g. {v.example}" for v in result["variants"]
               if not v.implemented]
    assert not missing, "\n".join(missing)
    assert not result["errors"], result["errors"]
    assert result["kernels"] == 2 * 12998
    declared = {(v.name, v.ret) for v in result["variants"]}
    assert {("air.atomic.global.min.u.i64", "void"), ("air.atomic.global.max.u.i64", "void"),
            ("air.sincos.f32", "float")} <= declared


def test_census_of_one_kernel_lists_its_declarations(fixture_metallib, tmp_path):
    path = tmp_path / "fixtures.metallib"
    path.write_bytes(fixture_metallib)
    out = tmp_path / "census.json"
    run = subprocess.run([sys.executable, "-m", "torch_metallib", "census", str(path), "--json", str(out),
                          "--fail-on-missing"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    record = json.loads(out.read_text())
    by_name = {v["name"]: v for v in record["variants"]}
    # What the fixtures' IR files declare, read from the files themselves.
    declared = set()
    for path in FIXTURES.glob("*.ll"):
        declared |= set(re.findall(r"^declare [^@\n]*@(air\.[\w.]+)\(", path.read_text(), re.M))
    assert set(by_name) == declared
    assert by_name["air.wg.barrier"]["parameters"] == ["i32", "i32"] and by_name["air.wg.barrier"]["cpu"]
    assert "implemented by the CPU backend, 0 missing" in run.stdout


def test_census_counts_what_kernels_call_not_what_they_declare(tmp_path):
    """Mojo's compiler declares builtins such as air.thread_position_in_threadgroup.x in every
    module, called or not: the census counts, per kernel, the intrinsics reflection lists
    (those the kernel can reach), not every declaration."""
    path = tmp_path / "mojo.metallib"
    path.write_bytes(tm.pack_modules(mojo_modules()))
    library = tm.load(path)
    called = {}
    for name in library.function_names:
        for intrinsic in library[name].reflection.intrinsics:
            called[intrinsic] = called.get(intrinsic, 0) + 1
    result = census([str(path)])
    assert {v.name: v.kernels for v in result["variants"]} == called
    assert "air.wg.barrier" in called and "air.thread_position_in_threadgroup.x" not in called


def test_census_refuses_a_missing_file(tmp_path):
    run = subprocess.run([sys.executable, "-m", "torch_metallib", "census", str(tmp_path / "none.metallib")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "no such file or folder" in run.stderr


def test_driver_supplied_functions_are_counted_and_refused_by_name(tmp_path):
    """Metal 4's tensor operations are functions Metal's driver links in (section
    air.externally_defined), not air.* intrinsics: the census lists them as missing, and a
    kernel calling one is refused naming it (a JIT link error would name nothing)."""
    # Stands for any driver function the backend lacks (every one the corpora use is defined).
    function = "__tensorops_impl_convolution2d_op_cooperative_tensor_num_elements"
    declaration = (f'declare i16 @{function}(i32 noundef, i32, i32, i32, i8, i8, i8, i32, ptr, i32, i32, i32) '
                   f'local_unnamed_addr #1 section "air.externally_defined"')
    body = ["%storage = alloca [64 x i8], align 16",
            f"%count = call i16 @{function}(i32 2, i32 16, i32 32, i32 16, i8 0, i8 0, i8 1, i32 1, ptr %storage, "
            f"i32 268435488, i32 268435488, i32 268435488) #2", "%size = zext i16 %count to i64",
            "%p = getelementptr i64, ptr addrspace(1) %out, i64 %gid64", "store i64 %size, ptr addrspace(1) %p"]
    library = tm.pack([tm.FunctionSource("k_tensor_ops", air.library("k_tensor_ops", air.module_text(
        "k_tensor_ops", body, [("out", "i64", "air.read_write")], [declaration], False))["k_tensor_ops"].bitcode)])
    path = tmp_path / "tensor_ops.metallib"
    path.write_bytes(library)
    result = census([str(path)])
    assert [(v.name, v.implemented) for v in result["variants"]] == [(function, False)]
    with pytest.raises(tm.UnsupportedKernelError, match=f"section air.externally_defined.*{function}"):
        tm.load(path)["k_tensor_ops"](torch.zeros(32, dtype=torch.int64), threads=32)
