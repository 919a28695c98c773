"""`lint`: each rule fires on a module crafted to break it and on no Apple-built function
(a slice of MLX, both torch libraries and the public corpus subset; tools/lint_corpus.py
runs all of them)."""

import json
import os
import pathlib
import re
import subprocess
import sys

import llvmlite.binding as llvm
import pytest

import torch_metallib as tm
from torch_metallib.lint.run import RULES, lint_bitcode, lint_path
from _public_corpus import subset_files

FIXTURE = (pathlib.Path(__file__).parent / "fixtures" / "vector_add_float.ll").read_text()
RULE = {rule.id: rule for rule in RULES}


def _findings(text: str, rule_id: str):
    bitcode = llvm.parse_assembly(text).as_bitcode()
    return [f.message for f in lint_bitcode(bitcode, "crafted", rules=[RULE[rule_id]])]


def _sub(pattern: str, replacement: str, text: str = FIXTURE, count: int = 1) -> str:
    edited, made = re.subn(pattern, replacement, text, count=count, flags=re.M)
    assert made, pattern
    return edited


CRAFTED = {
    "AIR002": (_sub(r'^attributes #0 = \{ ', "attributes #0 = { memory(none) "), "memory (86)"),
    "AIR010": (_sub(r"^!air\.version = !\{!10\}\n", ""), "!air.version"),
    "AIR011": (_sub(r"air64_v26-", "air64_v27-"), "says AIR 2.7, !air.version says 2.6"),
    "AIR012": (_sub(r"!\{!0, !1, !2, !3, ", "!{!0, !1, !2, "), "missing air.max_device_buffers"),
    "AIR013": (_sub(r"define weak_odr void @vector_add_float\(",
                    "declare void @vector_add_float(ptr addrspace(1), ptr addrspace(1), ptr addrspace(1), i32)\n"
                    "define weak_odr void @body("), "not defined"),
    "AIR014": (_sub(r"^(!\d+ = !\{!\d+, !\d+, !\d+), !\d+\}$", r"\1}"), "3 argument nodes for 4 parameters"),
    "AIR015": (_sub(r', !"air.arg_name", !"a"\}', "}"), "buffer argument 0: missing air.arg_name"),
    "AIR020": (_sub(r"= zext i32 %3", "= zext nneg i32 %3"), "'zext nneg'"),
    "AIR021": (_sub(r"getelementptr inbounds float, ptr addrspace\(1\) %0", "getelementptr nusw float, ptr addrspace(1) %0"),
               "'nusw'"),
    "AIR022": (_sub(r"^  ret void", "  %d = fpext float %10 to double\n  ret void"), "double value"),
    "AIR023": (_sub(r"^  ret void", "  %g = load { float, float }, ptr addrspace(1) %0, align 4\n  ret void"),
               "whole-aggregate access"),
    "AIR024": (_sub(r"^  ret void", "  %s = call float @llvm.sqrt.f32(float %10)\n  ret void") +
               "\ndeclare float @llvm.sqrt.f32(float)\n", "@llvm.sqrt.f32"),
}


@pytest.mark.parametrize("rule_id", sorted(CRAFTED))
def test_rule_fires_on_crafted_module_only(rule_id):
    text, expected = CRAFTED[rule_id]
    assert _findings(FIXTURE, rule_id) == []
    messages = _findings(text, rule_id)
    assert messages and expected in messages[0], messages


def test_every_rule_has_evidence_and_a_crafted_case():
    for rule in RULES:
        assert "https://" in rule.evidence, rule.id
        assert rule.severity in ("error", "warning")
    assert set(RULE) == set(CRAFTED) | {"AIR001", "AIR003"}


def test_bitcode_rules_see_what_llvm_hides(mlx_lib):
    """Apple's typed-pointer bitcode passes; the same module written back by llvmlite's LLVM
    (opaque pointers, its producer string) does not, although both print alike."""
    apple = bytes(getattr(mlx_lib, mlx_lib.function_names[0]).bitcode)
    assert lint_bitcode(apple, "apple", rules=[RULE["AIR001"], RULE["AIR003"]]) == []
    rewritten = llvm.parse_bitcode(apple[20:] if apple[:4] == b"\xde\xc0\x17\x0b" else apple).as_bitcode()
    rules = {f.rule for f in lint_bitcode(rewritten, "rewritten")}
    assert {"AIR001", "AIR003"} <= rules


def _assert_clean(path, every: int, limit: int = None):
    library = tm.load(path)
    names = library.function_names[::every][:limit]
    findings = [f for name in names for f in lint_bitcode(bytes(getattr(library, name).bitcode), f"{path}:{name}")]
    assert findings == [], findings[:5]
    return len(names)


def test_no_findings_on_apple_built_mlx(mlx_path):
    assert _assert_clean(mlx_path, 100) > 150


def test_no_findings_on_apple_built_torch(torch_libraries):
    for path in torch_libraries.values():
        assert _assert_clean(path, 400) > 25


def test_no_findings_on_apple_built_public_corpus():
    for path in subset_files():
        _assert_clean(path, 97, limit=4)


def test_no_findings_on_an_apple_built_llvm_intrinsic():
    """metal-linalg's bd_gemv_t (Xcode-built) calls llvm.usub.sat.i32: Apple's compiler does
    emit it, so AIR024 allows it (found by tools/lint_corpus.py over every function)."""
    path = next(p for p in subset_files() if p.name == "metal-linalg-2.19.0-_core@1ce2f0.metallib")
    assert [f for f in lint_path(str(path)) if "bd_gemv_t" in f.where] == []


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "torch_metallib", "lint", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_cli_exit_status_and_json(mlx_lib, tmp_path):
    apple = tmp_path / "apple.metallib"  # one Apple-built function, packed byte for byte
    apple.write_bytes(tm.pack_modules([bytes(getattr(mlx_lib, mlx_lib.function_names[0]).module)]))
    clean = _cli(str(apple))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "0 error(s), 0 warning(s)" in clean.stdout
    crafted = tmp_path / "crafted.ll"
    crafted.write_text(CRAFTED["AIR020"][0])
    result = _cli("--json", str(crafted))
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert {"AIR001", "AIR020"} <= {f["rule"] for f in report["findings"]}
    assert report["status"] == 1 and report["errors"] >= 2


def test_unreadable_input_is_a_finding(tmp_path):
    path = tmp_path / "junk.air"
    path.write_bytes(b"BC\xc0\xde" + b"\xff" * 7)
    findings = lint_path(str(path))
    assert [f.rule for f in findings] == ["AIR000"]
