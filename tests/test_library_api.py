"""Library and KernelFunction behaviour users rely on: lookup, errors, sources."""

import os

import pytest

import torch_metallib as tm


@pytest.fixture(scope="module")
def lib(fixture_metallib):
    return tm.load(fixture_metallib)


def test_lookup_by_item_and_attribute(lib):
    assert lib["vector_add_float"] is lib.vector_add_float  # cached per name
    assert "vector_add_float" in lib and "nope" not in lib and 3 not in lib
    assert list(lib) == list(lib.function_names) and len(lib) == len(lib.function_names)
    assert "vector_add_float" in dir(lib)


def test_missing_names_suggest_close_ones(lib):
    with pytest.raises(KeyError, match="Did you mean: vector_add_float"):
        lib["vector_add_floa"]
    with pytest.raises(AttributeError, match="Did you mean: vector_add_float"):
        lib.vector_add_flot
    assert not hasattr(lib, "no_such_kernel")
    with pytest.raises(KeyError, match="no function 'zzz'") as error:
        lib["zzz"]
    assert "Did you mean" not in str(error.value)
    with pytest.raises(TypeError, match="function names are str"):
        lib[0]


def test_subset_errors(lib):
    with pytest.raises(KeyError, match="Did you mean: vector_add_float"):
        lib.subset(["vector_add_flat"])
    with pytest.raises(ValueError, match="listed twice"):
        lib.subset(["vector_add_float", "vector_add_float"])
    with pytest.raises(ValueError, match="at least one"):
        lib.subset([])
    assert tm.load(lib.subset("vector_add_float")).function_names == ("vector_add_float",)


def test_repr_is_concise(lib):
    text = repr(lib)
    assert text.startswith("<torch_metallib.Library 5 functions, macos 14.0.0, format 1.2.7")
    assert repr(lib.vector_add_float).startswith("<KernelFunction 'vector_add_float' type=kernel")


def test_load_rejects_what_is_not_a_buffer_or_path():
    with pytest.raises(TypeError, match="expected bytes, bytearray, memoryview, mmap or a path"):
        tm.load(1234)
    with pytest.raises(FileNotFoundError):
        tm.load("/nonexistent/kernels.metallib")


def test_load_empty_file_is_a_format_error(tmp_path):
    path = tmp_path / "empty.metallib"
    path.write_bytes(b"")
    with pytest.raises(tm.MetallibFormatError, match="empty"):
        tm.load(path)


def test_format_error_is_a_value_error_with_offset_and_field():
    with pytest.raises(ValueError) as error:
        tm.load(b"MTLX" + bytes(100))
    assert isinstance(error.value, tm.MetallibFormatError)
    assert (error.value.offset, error.value.field) == (0, "magic")
    assert "expected 'MTLB'" in str(error.value)


def test_load_from_a_path_maps_the_file(fixture_metallib, tmp_path):
    path = tmp_path / "fixtures.metallib"
    path.write_bytes(fixture_metallib)
    lib = tm.load(path)
    assert lib.to_bytes() == fixture_metallib
    assert type(lib["vector_add_float"].bitcode.obj).__name__ == "mmap"
    os.remove(path)  # the mapping stays valid after the file is unlinked
    assert bytes(lib["scale_shift_float"].bitcode[:4]) == b"BC\xc0\xde"


def test_writable_buffers_are_exposed_read_only(fixture_metallib):
    lib = tm.load(bytearray(fixture_metallib))
    assert lib["vector_add_float"].bitcode.readonly
