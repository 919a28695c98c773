"""Mutation fuzzing of the container reader over real bytes (ARCHITECTURE.md, "Rules").

Every mutated input must either load or raise `MetallibFormatError`; when it loads, every
attribute, every function's bitcode, `to_bytes()` and `verify()` must too, and bytes that
`to_bytes()` writes must load again. Anything else (another exception, a crash, a hang)
fails the test with the seed and case index, so a case can be replayed alone:

    python tests/test_fuzz.py --seed S --case I INPUT...      # the inputs the test saved

The loop runs in a child process (this file run as a script), so a segfault is reported
as a failure with the last case index instead of killing pytest. Cases default to 10,000;
set TORCH_METALLIB_FUZZ_CASES (and TORCH_METALLIB_FUZZ_SEED) to change them.
"""

import argparse
import os
import pathlib
import random
import struct
import subprocess
import sys
import time
import traceback

import torch_metallib as tm

# Kernels of different families and sizes (elementwise, arange, copy, softmax, norm, GEMM,
# GEMV, convolution, attention, quantized, FFT, sort, scan, reduction): ~300 KB; names
# missing from a corpus version are skipped.
APPLE_KERNELS = (
    "vv_Addfloat32",
    "arangefloat32",
    "gg1_copybool_bool_",
    "block_softmax_float32",
    "rmsfloat32",
    "steel_gemm_fused_nn_float32_float32_bm64_bn64_bk16_wm2_wn2",
    "gemv_float32_bm1_bn8_sm1_sn32_tm4_tn4_nc0_axpby0",
    "implicit_gemm_conv_2d_general_float32_bm64_bn64_bk16_wm2_wn2",
    "steel_attention_float16_bq32_bk16_bd256_bv256_wm4_wn2_maskbool_",
    "sdpa_vector_float_64_64",
    "affine_qmv_float_gs_128_b_1_batch_1_pr_0_hgs_0_r_4",
    "bluestein_fft_mem_4096_float2_float2",
    "rader_fft_mem_512_float2_float2",
    "c_block_sort_uint8_uint8_bn32_tn4",
    "contig_scan_inclusive_sum_bool__int32",
    "all_reduce_andbool_",
)
FUZZ_CASES = int(os.environ.get("TORCH_METALLIB_FUZZ_CASES", "10000"))
FUZZ_SEED = int(os.environ.get("TORCH_METALLIB_FUZZ_SEED", "1337"))
TIMEOUT_SECONDS = 600

U64 = struct.Struct("<Q")
HEADER_SIZE = 88
HEADER_FIELDS = ((0, 4), (4, 2), (6, 2), (8, 2), (10, 1), (11, 1), (12, 2), (14, 1), (15, 1),
                 (16, 8)) + tuple((at, 8) for at in range(24, 88, 8))
INTERESTING = {
    1: (0x00, 0x01, 0x7F, 0x80, 0xFF),
    2: (0x0000, 0x0001, 0x0008, 0x7FFF, 0x8000, 0xFFFF),
    4: (0, 1, 4, 8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFC),
    8: (0, 1, 8, 2**63 - 1, 2**63, 2**64 - 1, 2**64 - 8, 2**32),
}


# --- mutations ---------------------------------------------------------------------------

def hot_ranges(data: bytes):
    """Byte ranges where one wrong field matters most: the header and section table, the
    function list and header extension, the metadata sections, the start of each module
    (its wrapper) and whatever follows the modules (reflection list). Parsed leniently:
    after earlier mutations the fields may be anything."""
    ranges = [(0, min(len(data), HEADER_SIZE))]
    if len(data) >= HEADER_SIZE:
        sections = [struct.unpack_from("<QQ", data, at) for at in range(24, 88, 16)]
        list_offset, list_size = sections[0]
        public_offset = sections[1][0]
        ranges.append((list_offset, max(list_offset + 4 + list_size, public_offset)))
        ranges.append((public_offset, sections[2][0] + sections[2][1]))
        module_offset, module_size = sections[3]
        ranges.append((module_offset, module_offset + 64))
        ranges.append((module_offset + module_size, len(data)))
    return [(lo, min(hi, len(data))) for lo, hi in ranges if lo < min(hi, len(data))]


def position(rng: random.Random, data: bytes, width: int = 1) -> int:
    limit = max(len(data) - width, 0)
    roll = rng.random()
    if roll < 0.25:  # a header field
        at, _size = rng.choice(HEADER_FIELDS)
        return min(at, limit)
    if roll < 0.75:
        ranges = hot_ranges(data)
        if ranges:
            lo, hi = rng.choice(ranges)
            return min(rng.randrange(lo, hi), limit)
    return rng.randint(0, limit)


def value(rng: random.Random, size: int, data: bytes, at: int) -> int:
    roll = rng.random()
    mask = (1 << (8 * size)) - 1
    if roll < 0.45:
        return rng.choice(INTERESTING[size])
    if roll < 0.7 and at + size <= len(data):  # nudge the current value
        current = int.from_bytes(data[at : at + size], "little")
        return (current + rng.choice((-16, -8, -4, -2, -1, 1, 2, 4, 8, 16, 4096))) & mask
    if roll < 0.85:  # something near the file's size
        return (len(data) + rng.randint(-16, 16)) & mask
    return rng.getrandbits(8 * size)


def flip_bits(rng, data: bytearray) -> str:
    if not data:
        return "no-op (empty)"
    spots = [position(rng, data) for _ in range(rng.choice((1, 1, 2, 3, 8)))]
    for at in spots:
        data[at] ^= 1 << rng.randrange(8)
    return f"flip bits at {spots}"


def set_byte(rng, data: bytearray) -> str:
    if not data:
        return "no-op (empty)"
    at, byte = position(rng, data), rng.choice((0x00, 0xFF, 0x7F, 0x80))
    data[at] = byte
    return f"byte {at} = {byte:#x}"


def overwrite_int(rng, data: bytearray) -> str:
    size = rng.choice((2, 4, 4, 8, 8))
    if len(data) < size:
        return "no-op (too short)"
    at = position(rng, data, size)
    number = value(rng, size, data, at)
    data[at : at + size] = number.to_bytes(size, "little")
    return f"u{8 * size} at {at} = {number:#x}"


def truncate(rng, data: bytearray) -> str:
    cut = position(rng, data) if rng.random() < 0.7 else rng.randint(0, len(data))
    del data[cut:]
    return f"truncate to {cut}"


def random_slice(rng, data: bytearray) -> tuple:
    """(start, length) of a slice to copy or delete, biased to the parsed fields."""
    return position(rng, data), rng.choice((1, 2, 4, 8, 16, 64, rng.randint(1, 4096)))


def duplicate_slice(rng, data: bytearray) -> str:
    if not data:
        return "no-op (empty)"
    start, length = random_slice(rng, data)
    piece = bytes(data[start : start + length])
    into = position(rng, data)
    data[into:into] = piece
    return f"copy [{start}:{start + len(piece)}] to {into}"


def delete_slice(rng, data: bytearray) -> str:
    if not data:
        return "no-op (empty)"
    start, length = random_slice(rng, data)
    del data[start : start + length]
    return f"delete [{start}:{start + length}]"


MUTATIONS = ((flip_bits, 5), (set_byte, 4), (overwrite_int, 6), (truncate, 1),
             (duplicate_slice, 1), (delete_slice, 1))


def mutate(seed: int, index: int, inputs):
    """Case `index` of run `seed`: (input number, mutated bytes, what was done). Each case
    has its own generator, so any one can be replayed without the others."""
    rng = random.Random(f"{seed}:{index}")
    source = rng.randrange(len(inputs))
    data = bytearray(inputs[source])
    operations, weights = zip(*MUTATIONS)
    steps = []
    for operation in rng.choices(operations, weights, k=rng.choice((1, 1, 1, 2, 3))):
        steps.append(operation(rng, data))
    if len(data) != len(inputs[source]) and len(data) >= 24 and rng.random() < 0.8:
        data[16:24] = U64.pack(len(data))  # get past the file-size check to what follows
        steps.append("file size fixed up")
    return source, bytes(data), "; ".join(steps)


# --- what every case must survive ----------------------------------------------------------

def exercise(data: bytes) -> str:
    """Loads `data` and uses everything; returns how far it got. Raises anything other
    than MetallibFormatError for the caller to report."""
    try:
        lib = tm.load(data)
    except tm.MetallibFormatError:
        return "rejected"
    repr(lib)
    (lib.file_version, lib.file_type, lib.platform, lib.platform_version, lib.uuid, lib.nbytes,
     lib.unknown_tags, len(lib), list(lib))
    for name in lib.function_names:
        assert name in lib, name
        function = lib[name]
        (function.name, function.type, function.hash, function.air_version,
         function.language_version, function.declared_constants, function.module_size,
         function.tags, repr(function))
        try:
            bytes(function.bitcode[:4])
        except tm.MetallibFormatError:
            pass
    outcome = "loaded"
    try:
        written = lib.to_bytes()
    except tm.MetallibFormatError:
        written = None
    if written is not None:
        try:
            tm.load(written)
        except tm.MetallibFormatError as error:
            raise AssertionError(f"to_bytes() wrote bytes that do not load: {error}") from error
    try:
        lib.verify()
        outcome = "verified"
    except tm.MetallibFormatError:
        pass
    return outcome


def run(inputs, seed: int, cases: int, progress_path: str, first: int = 0,
        input_paths=("INPUT...",)) -> dict:
    outcomes = {}
    with open(progress_path, "w") as progress:
        for index in range(first, first + cases):
            source, data, steps = mutate(seed, index, inputs)
            # Written before the case runs, so a crash leaves the case that caused it.
            progress.seek(0)
            progress.write(f"seed {seed} case {index} input {source} ({len(data)} bytes): {steps}\n")
            progress.truncate()
            progress.flush()
            try:
                outcome = exercise(data)
            except Exception:  # noqa: BLE001 - every non-format error is the finding
                raise SystemExit(
                    f"FUZZ FAILURE seed {seed} case {index} input {source}: {steps}\n"
                    + traceback.format_exc()
                    + f"replay: {sys.executable} {__file__} --seed {seed} --case {index} "
                    + " ".join(input_paths) + "\n"
                )
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="valid .metallib files to mutate")
    parser.add_argument("--seed", type=int, default=FUZZ_SEED)
    parser.add_argument("--cases", type=int, default=FUZZ_CASES)
    parser.add_argument("--case", type=int, help="replay only this case index")
    parser.add_argument("--progress", default=os.devnull)
    args = parser.parse_args(argv)
    inputs = [pathlib.Path(path).read_bytes() for path in args.inputs]
    first, cases = (args.case, 1) if args.case is not None else (0, args.cases)
    started = time.perf_counter()
    outcomes = run(inputs, args.seed, cases, args.progress, first, args.inputs)
    elapsed = time.perf_counter() - started
    print(f"cases {sum(outcomes.values())} seconds {elapsed:.1f} "
          + " ".join(f"{key} {count}" for key, count in sorted(outcomes.items())))


# --- the test --------------------------------------------------------------------------------

def test_mutated_inputs_load_or_raise_format_error(mlx_lib, fixture_metallib, tmp_path):
    names = [name for name in APPLE_KERNELS if name in mlx_lib]
    assert len(names) >= 10, names
    apple = mlx_lib.subset(names)
    inputs = []
    for label, data in (("apple", apple), ("fixture", fixture_metallib)):
        tm.load(data, verify=True)
        path = tmp_path / f"{label}.metallib"
        path.write_bytes(data)
        inputs.append(str(path))
    progress = tmp_path / "progress.txt"
    command = [sys.executable, __file__, "--seed", str(FUZZ_SEED), "--cases", str(FUZZ_CASES),
               "--progress", str(progress), *inputs]
    # The child imports the same torch_metallib as this process, installed or in place.
    package_root = str(pathlib.Path(tm.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    started = time.perf_counter()
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
                               env=env)
    except subprocess.TimeoutExpired:
        last = progress.read_text() if progress.exists() else "(no case started)"
        raise AssertionError(f"fuzz child hung for {TIMEOUT_SECONDS} s; last case: {last}") from None
    elapsed = time.perf_counter() - started
    last = progress.read_text() if progress.exists() else "(no case started)"
    assert child.returncode == 0, (
        f"fuzz child exited with {child.returncode} (negative = killed by that signal); "
        f"last case: {last}\nstdout: {child.stdout[-2000:]}\nstderr: {child.stderr[-6000:]}\n"
        f"inputs ({len(apple)} and {len(fixture_metallib)} bytes) kept in {tmp_path}"
    )
    summary = child.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"cases {FUZZ_CASES} "), summary
    print(f"fuzz: {summary}; {elapsed:.1f} s with process start; inputs {len(apple):,} and "
          f"{len(fixture_metallib):,} bytes, {len(names)} Apple kernels")


if __name__ == "__main__":
    main()
