"""Mutation fuzzing of .metallib loading and reflection, each case in a child process.

    python tools/fuzz_metallib.py --cases 1000000 --jobs 2 --out crashes/ SEED.metallib...
    python tools/fuzz_metallib.py --rehash --cases 20000 --out crashes/ SEED.metallib...
    python tools/fuzz_metallib.py --seed S --case I --out crashes/ SEED.metallib...   # replay one

Each case mutates one seed file (header and section-table fields, tag groups, sizes and
offsets, module bytes; truncation, duplicated and deleted slices) and must then either fail
to load with `MetallibFormatError`, or load, after which every attribute, every function's
bitcode and reflection (`ReflectionError` is allowed there), `to_bytes()` (whose output
must load again) and `verify()` must work or raise those errors. A crash (signal), a hang
(no progress for --case-timeout seconds) or any other exception is a finding: it is
reported with its seed and case index, and the mutated bytes are written to --out as a
reproducer file.

Without --rehash, a mutated module keeps its old HASH, so LLVM must never see it (the HASH
check comes first). With --rehash, mutations stay inside module bytes and every changed
module's HASH is recomputed: LLVM's bitcode reader then parses damaged bitcode, which a
crafted file can do too (README, "Security"); the figures say how often that crashes.

Cases run in forked workers (--jobs); a worker that dies is replaced and continues after
the case that killed it. Every case has its own random generator (seed, index), so any
case replays alone.
"""

import argparse
import hashlib
import multiprocessing
import os
import pathlib
import random
import struct
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Dict, List

import torch_metallib as tm

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




def module_layout(data: bytes):
    """[(module start, module size, HASH payload offset)] of a valid seed, for --rehash."""
    lib = tm.load(data)
    layout = []
    for name in lib.function_names:
        function = lib[name]
        hash_tag = next(offset for tag, offset, _payload in function.tags if tag == "HASH")
        layout.append((function._record["module_offset"], function.module_size, hash_tag + 6))
    return layout


def mutate_module(rng: random.Random, data: bytearray, layout) -> str:
    """Flips, sets or overwrites bytes inside one function's module (wrapper or bitcode)."""
    start, size, _hash_at = rng.choice(layout)
    steps = []
    for _ in range(rng.choice((1, 1, 2, 4, 16))):
        at = start + rng.randrange(size)
        roll = rng.random()
        if roll < 0.5:
            data[at] ^= 1 << rng.randrange(8)
            steps.append(f"flip {at}")
        elif roll < 0.75:
            data[at] = rng.choice((0x00, 0xFF, 0x7F, 0x80))
            steps.append(f"set {at}")
        elif at + 4 <= start + size:
            number = value(rng, 4, data, at)
            data[at : at + 4] = number.to_bytes(4, "little")
            steps.append(f"u32 {at}")
    return "module bytes: " + ", ".join(steps)


def rehash(data: bytearray, layout) -> int:
    """Writes the SHA-256 of every module into its HASH tag; returns how many changed."""
    changed = 0
    for start, size, hash_at in layout:
        digest = hashlib.sha256(data[start : start + size]).digest()
        if data[hash_at : hash_at + 32] != digest:
            data[hash_at : hash_at + 32] = digest
            changed += 1
    return changed


def make_case(seed: int, index: int, inputs, layouts=None):
    """Case `index`: (seed file number, mutated bytes, what was done). With `layouts`
    (--rehash), module bytes are mutated and their HASHes recomputed."""
    if layouts is None:
        return mutate(seed, index, inputs)
    rng = random.Random(f"{seed}:{index}:rehash")
    source = rng.randrange(len(inputs))
    data = bytearray(inputs[source])
    step = mutate_module(rng, data, layouts[source])
    changed = rehash(data, layouts[source])
    return source, bytes(data), f"{step}; {changed} HASH recomputed"


# --- what every case must survive ----------------------------------------------------------

# HASHes of modules already reflected in this process: a module whose bitcode passed the
# HASH check has exactly those bytes, so reflecting it again would repeat a known outcome.
_reflected = set()
_reflection_errors = 0  # ReflectionErrors raised in this process (an LLVM abort caught is one)


def exercise(data: bytes) -> str:
    """Loads `data` and uses everything, reflection included; returns how far it got:
    "rejected" by load, "rejected_on_use" (a function's metadata, read when the function
    is first used), "loaded" or "verified". Raises anything other than MetallibFormatError
    (or ReflectionError from reflection) for the caller to report."""
    try:
        lib = tm.load(data)
    except tm.MetallibFormatError:
        return "rejected"
    try:
        return _use(lib)
    except tm.MetallibFormatError:
        return "rejected_on_use"


def _use(lib) -> str:
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
            continue
        if function.hash not in _reflected:  # LLVM reads only bytes that match their HASH
            try:
                function.arguments, function.signature
            except tm.ReflectionError:
                global _reflection_errors
                _reflection_errors += 1
            _reflected.add(function.hash)
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



# --- running cases in workers ----------------------------------------------------------------

@dataclass
class Report:
    cases: int = 0
    outcomes: Dict[str, int] = field(default_factory=dict)
    crashes: List[str] = field(default_factory=list)
    hangs: List[str] = field(default_factory=list)
    foreign: List[str] = field(default_factory=list)
    reflection_errors: int = 0  # reported by workers that finished
    seconds: float = 0.0

    def summary(self) -> str:
        outcomes = " ".join(f"{key} {count}" for key, count in sorted(self.outcomes.items()))
        return (f"cases {self.cases} seconds {self.seconds:.1f} {outcomes} reflection_errors "
                f"{self.reflection_errors} crashes {len(self.crashes)} "
                f"hangs {len(self.hangs)} foreign {len(self.foreign)}")


def _worker(inputs, layouts, seed, first, last, current, results, use=None):
    """Runs cases [first, last); `current` holds the case in progress (read by the parent
    when this process dies or stalls). Sends outcome counts and foreign exceptions.
    `use`: what each case must survive, instead of `exercise` (another reader's fuzzer)."""
    outcomes, foreign = {}, []
    for index in range(first, last):
        current.value = index
        source, data, steps = make_case(seed, index, inputs, layouts)
        try:
            outcome = (use or exercise)(data)
        except Exception:  # noqa: BLE001 - every non-project error is a finding
            outcome = "foreign"
            foreign.append((index, source, steps, traceback.format_exc()))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    current.value = last
    results.send((outcomes, foreign, _reflection_errors))


MAX_REPRODUCERS = 50  # per kind: a systematic failure would otherwise fill the disk


def _write_reproducer(out_dir, kind, seed, index, inputs, layouts, detail, written: int) -> str:
    source, data, steps = make_case(seed, index, inputs, layouts)
    if written >= MAX_REPRODUCERS:
        return f"{kind} seed {seed} case {index} (seed file {source}: {steps}); no reproducer written (limit)"
    path = pathlib.Path(out_dir) / f"{kind}-seed{seed}-case{index}.metallib"
    path.write_bytes(data)
    path.with_suffix(".txt").write_text(f"{kind} at seed {seed} case {index}, seed file {source}: {steps}\n{detail}\n")
    return f"{kind} seed {seed} case {index} (seed file {source}: {steps}) -> {path}"


def fuzz(inputs, seed: int, cases: int, jobs: int = 1, rehash_modules: bool = False, out_dir: str = ".",
         case_timeout: float = 30.0, first: int = 0, use=None) -> Report:
    """Runs cases [first, first + cases) over `inputs` (bytes of valid metallibs) in forked
    workers and returns what happened; reproducers of findings go to `out_dir`. `use`:
    what each case must survive, where it is not `exercise` (tools/fuzz_archive.py)."""
    os.makedirs(out_dir, exist_ok=True)
    layouts = [module_layout(data) for data in inputs] if rehash_modules else None
    context = multiprocessing.get_context("fork")
    report, started = Report(), time.perf_counter()
    step = -(-cases // jobs)
    pending = [(lo, min(lo + step, first + cases)) for lo in range(first, first + cases, step)]
    running = []

    def start(lo, hi):
        current = context.Value("q", lo, lock=False)
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_worker, args=(inputs, layouts, seed, lo, hi, current, send, use))
        process.start()
        send.close()
        running.append([process, lo, hi, current, receive, lo, time.monotonic()])

    for lo, hi in pending:
        start(lo, hi)
    while running:
        time.sleep(0.05)
        for entry in list(running):
            process, lo, hi, current, receive, seen, since = entry
            message = None
            if receive.poll():
                try:
                    message = receive.recv()
                except EOFError:  # the worker died without reporting
                    pass
            if message is not None:
                outcomes, foreign, reflection_errors = message
                report.reflection_errors += reflection_errors
                process.join()
                running.remove(entry)
                for key, count in outcomes.items():
                    report.outcomes[key] = report.outcomes.get(key, 0) + count
                report.cases += sum(outcomes.values())
                for index, _source, _steps, text in foreign:
                    report.foreign.append(_write_reproducer(out_dir, "foreign", seed, index, inputs, layouts, text,
                                                            len(report.foreign)))
                continue
            index = current.value
            if index != seen:
                entry[5], entry[6] = index, time.monotonic()
            if not process.is_alive() or time.monotonic() - entry[6] > case_timeout:
                if process.is_alive():
                    process.kill()
                    kind = "hang"
                else:
                    kind = "crash"
                process.join()
                receive.close()
                running.remove(entry)
                # The cases before `index` completed but their counts died with the worker:
                # count them as run (they raised nothing, or the worker would have said).
                report.outcomes["unrecorded"] = report.outcomes.get("unrecorded", 0) + index - lo
                report.cases += index - lo + 1
                findings = report.crashes if kind == "crash" else report.hangs
                findings.append(_write_reproducer(out_dir, kind, seed, index, inputs, layouts,
                                                  f"exit code {process.exitcode}", len(findings)))
                if index + 1 < hi:
                    start(index + 1, hi)
    report.seconds = time.perf_counter() - started
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="valid .metallib files to mutate")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--case", type=int, help="run only this case index")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rehash", action="store_true", help="mutate module bytes and recompute HASHes")
    parser.add_argument("--out", default="fuzz-findings", help="folder for reproducer files")
    parser.add_argument("--case-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    inputs = [pathlib.Path(path).read_bytes() for path in args.inputs]
    for path, data in zip(args.inputs, inputs):
        tm.load(data, verify=True)  # seeds must be valid
    first, cases = (args.case, 1) if args.case is not None else (0, args.cases)
    report = fuzz(inputs, args.seed, cases, min(args.jobs, cases), args.rehash, args.out,
                  args.case_timeout, first)
    for finding in (report.crashes + report.hangs + report.foreign)[:3 * MAX_REPRODUCERS]:
        print(finding)
    print(report.summary())
    return 1 if report.crashes or report.hangs or report.foreign else 0


if __name__ == "__main__":
    sys.exit(main())
