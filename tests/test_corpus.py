"""The Apple-built MLX corpus: counts, names, hashes, round trips, subsets."""

import gc
import hashlib
import mmap
import pathlib
import struct

import llvmlite.binding as llvm

import torch_metallib as tm
from _bytes_diff import first_difference

MLX_FUNCTION_COUNT = 17_248
# Kernels named in MLX's sources (mlx/backend/metal/kernels), one per family we rely on.
KNOWN_KERNELS = (
    "vv_Addfloat32",
    "block_softmax_float32",
    "looped_softmax_float32",
    "arangefloat32",
    "steel_gemm_fused_nn_float32_float32_bm64_bn64_bk16_wm2_wn2",
    "sdpa_vector_float_64_64",
    "gg1_copybool_bool_",
)
SUBSET = ("sdpa_vector_float_64_64", "vv_Addfloat32", "block_softmax_float32",
          "steel_gemm_fused_nn_float32_float32_bm64_bn64_bk16_wm2_wn2")


def test_function_count_and_known_names(mlx_lib):
    assert len(mlx_lib) == MLX_FUNCTION_COUNT
    assert len(set(mlx_lib.function_names)) == MLX_FUNCTION_COUNT
    for name in KNOWN_KERNELS:
        assert name in mlx_lib
        assert mlx_lib[name].name == name
        assert mlx_lib[name].type == "kernel"


def test_header_fields(mlx_lib, mlx_bytes):
    # Compared with the raw header bytes, decoded here independently of the reader.
    format_word, minor, patch, file_type, platform, os_major, os_minor, os_patch = \
        struct.unpack_from("<HHHBBHBB", mlx_bytes, 4)
    assert mlx_lib.file_version == (format_word & 0x7FFF, minor, patch) == (1, 2, 7)
    assert mlx_lib.file_type == "executable" and file_type == 0
    assert mlx_lib.platform == "macos" and platform == 0x81
    assert mlx_lib.platform_version == (os_major, os_minor, os_patch) == (14, 0, 0)
    assert mlx_lib.nbytes == len(mlx_bytes)
    assert mlx_lib.unknown_tags == []


def test_every_hash_is_sha256_of_its_module(mlx_lib, mlx_bytes):
    module_section = struct.unpack_from("<Q", mlx_bytes, 72)[0]
    for name in mlx_lib.function_names:
        function = mlx_lib[name]
        tags = {tag: payload for tag, _offset, payload in function.tags}
        offset = module_section + struct.unpack_from("<3Q", tags["OFFT"])[2]
        size = struct.unpack_from("<Q", tags["MDSZ"])[0]
        module = mlx_bytes[offset:offset + size]
        assert bytes(function.module) == module, name
        assert hashlib.sha256(module).hexdigest() == function.hash, name
        assert function.hash == tags["HASH"].hex()


def test_versions_and_constants(mlx_lib):
    versions = {(mlx_lib[n].air_version, mlx_lib[n].language_version) for n in mlx_lib}
    assert versions == {((2, 6), (3, 1))}
    gemm = mlx_lib["steel_gemm_fused_nn_float32_float32_bm64_bn64_bk16_wm2_wn2"]
    constants = {c.name: (c.type, c.index, c.required) for c in gemm.declared_constants}
    # Declared in MLX's steel/gemm/kernels/steel_gemm_fused.h.
    assert constants == {
        "has_batch": ("bool", 10, True), "use_out_source": ("bool", 100, True),
        "do_axpby": ("bool", 110, True), "align_M": ("bool", 200, True),
        "align_N": ("bool", 201, True), "align_K": ("bool", 202, True),
    }
    assert mlx_lib["vv_Addfloat32"].declared_constants == []


def test_bitcode_is_air_that_llvm_parses(mlx_lib):
    for name in KNOWN_KERNELS:
        bitcode = mlx_lib[name].bitcode
        assert bitcode.readonly and bytes(bitcode[:4]) == b"BC\xc0\xde"
        module = llvm.parse_bitcode(bytes(bitcode), context=llvm.create_context())
        assert module.triple.startswith("air64"), module.triple
        assert name in [f.name for f in module.functions]


def test_round_trip_is_byte_identical(mlx_lib, mlx_bytes):
    written = mlx_lib.to_bytes()
    assert written == mlx_bytes, first_difference(written, mlx_bytes)


def test_verify_accepts_the_corpus(mlx_lib):
    mlx_lib.verify()


def test_subset_round_trips_and_reloads(mlx_lib):
    data = mlx_lib.subset(SUBSET)
    sub = tm.load(data, verify=True)
    assert sub.function_names == SUBSET
    assert sub.to_bytes() == data, first_difference(sub.to_bytes(), data)
    for name in SUBSET:
        assert sub[name].hash == mlx_lib[name].hash
        assert bytes(sub[name].bitcode) == bytes(mlx_lib[name].bitcode)
        assert sub[name].tags[-1][0] == "RFLT"  # reflection entries carried over
    assert (sub.file_version, sub.platform, sub.platform_version) == \
        (mlx_lib.file_version, mlx_lib.platform, mlx_lib.platform_version)
    # The UUID is derived from the content: new for a new set, stable for the same set.
    assert sub.uuid is not None and sub.uuid != mlx_lib.uuid
    assert mlx_lib.subset(SUBSET) == data
    assert tm.load(mlx_lib.subset(SUBSET[::-1])).function_names == SUBSET[::-1]
    # A subset of a subset is again valid and identical to subsetting the original.
    assert sub.subset(SUBSET[1:3]) == mlx_lib.subset(SUBSET[1:3])


def test_every_source_kind_gives_the_same_library(mlx_path, mlx_bytes, mlx_lib):
    with open(mlx_path, "rb") as file:
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    sources = [mlx_bytes, bytearray(mlx_bytes[:0]) + mlx_bytes, memoryview(mlx_bytes),
               mapping, mlx_path, pathlib.Path(mlx_path)]
    for source in sources:
        lib = tm.load(source)
        assert lib.function_names == mlx_lib.function_names, type(source)
        assert bytes(lib["vv_Addfloat32"].bitcode) == bytes(mlx_lib["vv_Addfloat32"].bitcode)


def test_bitcode_is_a_zero_copy_view(mlx_bytes):
    lib = tm.load(mlx_bytes)
    view = lib["vv_Addfloat32"].bitcode
    assert view.obj is mlx_bytes  # a slice of the caller's bytes, not a copy
    assert view.readonly


def test_a_function_keeps_its_mapped_file_alive(mlx_path):
    function = tm.load(mlx_path)["vv_Addfloat32"]  # no other reference to the Library
    gc.collect()
    assert bytes(function.bitcode[:4]) == b"BC\xc0\xde"
    assert function.library.function_names[0] == "gg1_copybool_bool_"
