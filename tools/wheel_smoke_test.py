"""Smoke test of an installed torch_metallib wheel; tools/wheel_smoke.sh runs it in a fresh
venv, from a temporary folder, so that only the installed package can be imported.

    python wheel_smoke_test.py --source-root CHECKOUT --fixtures CHECKOUT/tests/fixtures [--no-mlx]

It checks that the package and its native module come from the venv (not the checkout)
and that the metadata carries ``__version__``; then, on the CPU backend: the project's
fixture kernels packed from their .ll text (tests/fixtures, read as data) and loaded, a
kernel's arguments inspected, an elementwise kernel, a function-constant kernel and a
threadgroup (barrier) kernel called and compared with torch, an operator defined with
``ops.define`` and called; the same on Apple-built ``mlx.metallib`` (the cached corpus:
``python -m torch_metallib corpus``); and the command line, both as the ``torch-metallib``
console script and as ``python -m torch_metallib``. Prints one line per check.
"""

import argparse
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

START = time.perf_counter()


def check(what: str, condition: bool, detail: object = "") -> None:
    if not condition:
        raise SystemExit(f"wheel smoke test FAILED: {what}: {detail}")
    detail = " ".join(str(detail).split())
    detail = detail if len(detail) <= 110 else detail[:107] + "..."
    print(f"ok  {time.perf_counter() - START:6.2f}s  {what}" + (f": {detail}" if detail else ""), flush=True)


def inside(path: str, folder: pathlib.Path) -> bool:
    try:
        pathlib.Path(path).resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def check_isolation(source_root: pathlib.Path) -> None:
    import torch_metallib as tm
    from torch_metallib import _C

    venv = pathlib.Path(sys.prefix)
    check("running in a venv", sys.prefix != sys.base_prefix, sys.prefix)
    for module in (tm, _C):
        check(f"{module.__name__} is the installed one", inside(module.__file__, venv) and
              not inside(module.__file__, source_root), module.__file__)
    leaks = [entry for entry in sys.path if entry and inside(entry, source_root)]
    check("no sys.path entry inside the checkout", not leaks, leaks or "")
    # setuptools' editable installs append a finder (a class) mapping torch_metallib to a checkout.
    modules = [getattr(finder, "__module__", None) or type(finder).__module__ for finder in sys.meta_path]
    finders = [module for module in modules if "editable" in module]
    check("no editable-install finder active", not finders, finders or "")
    distribution = importlib.metadata.distribution("torch_metallib")
    check("metadata from the venv", inside(str(distribution.locate_file("")), venv), distribution.locate_file(""))
    check("metadata version is __version__", distribution.version == tm.__version__,
          f"{distribution.version} == {tm.__version__}")
    requirements = [r for r in distribution.requires or [] if "extra ==" not in r]
    for requirement in requirements:
        name, operator, wanted = re.match(r"([A-Za-z0-9_.-]+)\s*(==|>=)\s*([0-9.*]+)$", requirement).groups()
        installed = importlib.metadata.version(name)
        numbers = [int(part) for part in re.findall(r"\d+", installed.split("+")[0])]
        if operator == "==":  # torch==X.Y.*: the minor release the extension was built against
            ok = wanted.endswith(".*") and installed.split("+")[0].startswith(wanted[:-1])
        else:
            ok = numbers >= [int(part) for part in wanted.split(".")]
        check(f"dependency {requirement} installed", ok, installed)
    torch_pin = [r for r in requirements if r.startswith("torch")]
    check("torch pinned to the minor release the wheel was built against", torch_pin and
          re.fullmatch(r"torch==\d+\.\d+\.\*", torch_pin[0].replace(" ", "")), torch_pin)
    check("LICENSE shipped", any(str(file).endswith("LICENSE") for file in distribution.files or []))
    native = [str(f) for f in distribution.files or [] if str(f).startswith("torch_metallib/_C")]
    sources = [str(f) for f in distribution.files or [] if "/csrc/" in str(f)]
    check("the wheel holds the native module and no C++ sources", len(native) == 1 and not sources,
          native + sources[:3])


def check_fixtures(fixtures: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    import llvmlite.binding as llvm
    import torch

    import torch_metallib as tm
    from torch_metallib import ops

    def bitcode(name: str) -> bytes:
        module = llvm.parse_assembly((fixtures / f"{name}.ll").read_text(), context=llvm.create_context())
        module.verify()
        return module.as_bitcode()

    names = ["vector_add_float", "function_constant_scale", "threadgroup_sum_float"]
    constants = (tm.FunctionConstant("use_bias", "bool", 0, True), tm.FunctionConstant("alpha", "float", 1, True))
    sources = [tm.FunctionSource(name, bitcode(name), function_constants=constants if name == names[1] else ())
               for name in names]
    path = folder / "fixtures.metallib"
    path.write_bytes(tm.pack(sources))
    lib = tm.load(str(path))
    check("pack + load (fixtures)", set(lib.function_names) == set(names), lib.function_names)

    k = lib.vector_add_float
    arguments = [(a.name, a.kind, a.binding, a.access, a.type_name, a.builtin) for a in k.arguments]
    check("reflection: vector_add_float's arguments", arguments == [
        ("a", "buffer", 0, "read", "float", None), ("b", "buffer", 1, "read", "float", None),
        ("out", "buffer", 2, "read_write", "float", None),
        ("index", "builtin", None, None, "uint", "thread_position_in_grid")], arguments)

    a, b, out = torch.randn(1000), torch.randn(1000), torch.empty(1000)
    k(a, b, out)
    check("CPU call: vector_add_float == torch a + b", torch.equal(out, a + b))

    x, y = torch.randn(100), torch.empty(100)
    lib.function_constant_scale(x, y, constants={"use_bias": False, "alpha": 3.0})
    check("CPU call with function constants: y == 3 x", torch.allclose(y, 3 * x))

    x, sums = torch.randn(4 * 64), torch.empty(4)
    lib.threadgroup_sum_float(x, sums, threads=x.numel(), group_size=64, threadgroup_memory={0: 64 * 4})
    check(f"CPU call with barriers ({lib.threadgroup_sum_float.cpu_scheme}): per-group sums",
          torch.allclose(sums, x.view(4, 64).sum(1), rtol=1e-5, atol=1e-5))

    ops.define("tm_smoke::scale(Tensor x, Tensor? bias, float alpha) -> Tensor", lib, "function_constant_scale",
               dtypes=[torch.float32], bind={"in": "x"}, outputs={"out": ops.like("x")},
               constants={"use_bias": ops.present("bias"), "alpha": "alpha"}, threads=ops.numel("x"))
    x, bias = torch.randn(64), torch.randn(64)
    check("ops.define: tm_smoke::scale(x, None, 2)", torch.allclose(torch.ops.tm_smoke.scale(x, None, 2.0), 2 * x))
    check("ops.define: tm_smoke::scale(x, bias, 2)",
          torch.allclose(torch.ops.tm_smoke.scale(x, bias, 2.0), 2 * x + bias, atol=1e-6))
    return path


def check_mlx() -> str:
    import torch

    import torch_metallib as tm
    from torch_metallib import ops
    from torch_metallib.cache.corpus import mlx_metallib_path

    try:
        path = mlx_metallib_path(download=False)
    except FileNotFoundError as error:
        raise SystemExit(f"wheel smoke test FAILED: no cached mlx.metallib ({error}); "
                         "fetch it with `python -m torch_metallib corpus`, or pass --no-mlx")
    lib = tm.load(path)
    check("load mlx.metallib (Apple-built)", len(lib) == 17248, f"{len(lib)} kernels")
    k = lib.vv_Addfloat32
    check("reflection: vv_Addfloat32", [a.name for a in k.arguments] == ["a", "b", "c", "size", "index"], k.signature)
    a, b, c = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    k(a, b, c, 4096)
    check("CPU call: vv_Addfloat32 == torch a + b", torch.equal(c, a + b))
    ops.define("tm_smoke::sigmoid(Tensor x) -> Tensor", lib, "v_Sigmoid{dtype}{dtype}",
               dtypes=[torch.float32, torch.float16], bind={"in": "x", "size": ops.numel("x")},
               outputs={"out": ops.like("x")}, threads=ops.numel("x"))
    x = torch.randn(3, 333)
    check("ops.define: tm_smoke::sigmoid on MLX's kernel == torch.sigmoid",
          torch.allclose(torch.ops.tm_smoke.sigmoid(x), torch.sigmoid(x), atol=1e-6))
    return path


def check_cli(library: pathlib.Path, kernel: str) -> None:
    script = shutil.which("torch-metallib")
    check("console script in the venv", script is not None and inside(script, pathlib.Path(sys.prefix)), script)
    for command in ([script, "--help"],
                    [sys.executable, "-m", "torch_metallib", "inspect", str(library), "--function", kernel]):
        result = subprocess.run(command, capture_output=True, text=True)
        shown = " ".join(os.path.basename(part) if os.path.isabs(part) else part for part in command)
        check(f"CLI: {shown} exits 0", result.returncode == 0, result.stderr[-2000:] if result.returncode else "")
        if command[-1] == "--help":
            check("  its usage names inspect", "inspect" in result.stdout, result.stdout[:200])
        else:
            check(f"  it prints {kernel}'s signature", f"kernel void {kernel}(" in result.stdout,
                  result.stdout[-300:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source-root", type=pathlib.Path, required=True, help="the checkout that must not leak")
    parser.add_argument("--fixtures", type=pathlib.Path, required=True, help="tests/fixtures (the .ll files)")
    parser.add_argument("--no-mlx", action="store_true", help="skip the checks on the cached mlx.metallib")
    args = parser.parse_args()
    check_isolation(args.source_root)
    with tempfile.TemporaryDirectory() as folder:
        fixtures = check_fixtures(args.fixtures, pathlib.Path(folder))
        if args.no_mlx:
            check_cli(fixtures, "vector_add_float")
        else:
            check_cli(pathlib.Path(check_mlx()), "vv_Addfloat32")
    print(f"wheel smoke test passed in {time.perf_counter() - START:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
