"""`tm.pack_modules` against Apple's own tool: functions of Apple-built libraries packed again
from their modules alone carry the tags Apple wrote (tools/repack_check.py over a slice; the
whole corpus is `python tools/repack_check.py`)."""

import pathlib
import sys

import pytest

import torch_metallib as tm
from _public_corpus import subset_files

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "tools"))
from repack_check import repack_check  # noqa: E402

# Derived from the module; RFLT points into Apple's reflection list (serialized reflection
# Apple's tool writes in its own format), which a module does not give.
DERIVED = {"NAME", "TYPE", "HASH", "OFFT", "VERS", "MDSZ", "CNST"}
NOT_DERIVED = {"RFLT"}


def check(library: tm.Library, names) -> dict:
    result = repack_check(library, names)
    for tag, counts in result["tags"].items():
        wrong = {k: v for k, v in counts.items() if k != "match"}
        if tag in NOT_DERIVED:
            assert set(wrong) <= {"apple_only"} and not counts["match"], (tag, counts)
        else:
            assert tag in DERIVED and not wrong, (tag, counts, result["examples"])
    for field in ("file_version", "platform", "platform_version"):
        apple, ours = result["header"][field]
        assert apple == ours, (field, apple, ours)
    assert {"NAME", "HASH", "VERS", "OFFT"} <= set(result["tags"])
    return result


def every(names, count):
    return names[::max(1, len(names) // count)]


def test_mlx_slice_repacks_as_apple_wrote_it(mlx_lib):
    names = every(mlx_lib.function_names, 300)
    with_constants = [n for n in mlx_lib.function_names if mlx_lib[n].declared_constants][::40]
    result = check(mlx_lib, sorted(set(names) | set(with_constants), key=mlx_lib.function_names.index))
    assert result["tags"]["CNST"]["match"] >= 20 and result["functions"] >= 300


def test_public_corpus_files_repack_as_apple_wrote_them():
    kinds = set()
    for path in subset_files():
        library = tm.load(path)
        check(library, every(library.function_names, 40))
        kinds.update(library[n].type for n in library.function_names)
    assert kinds == {"kernel", "vertex", "fragment"}


@pytest.mark.parametrize("which", ["macos14", "macos26"])
def test_torch_libraries_repack_as_apple_wrote_them(torch_libraries, which):
    library = tm.load(torch_libraries[which])
    check(library, library.function_names[:150])


def test_the_check_sees_a_difference(mlx_lib, monkeypatch):
    """A VERS that is not the module's shows up as VERS differing, the rest still matching."""
    from torch_metallib.reflection.module_source import read_module

    def wrong_air_version(modules):
        sources = [read_module(module).function for module in modules]
        for source in sources:
            source.air_version = (2, 5)
        return tm.pack(sources)

    monkeypatch.setattr(tm, "pack_modules", wrong_air_version)
    result = repack_check(mlx_lib, mlx_lib.function_names[:3])
    assert result["tags"]["VERS"] == {"differ": 3} and result["tags"]["HASH"] == {"match": 3}
