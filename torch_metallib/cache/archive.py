"""Ahead-of-time archives: compiled kernels in one versioned file (``precompile`` writes
them, ``tm.load(..., archives=)`` and ``TORCH_METALLIB_ARCHIVES`` read them).

The reader takes untrusted bytes: every count, length and offset is checked against the
file before it is used, and every payload against its SHA-256 at load, so a damaged,
truncated or foreign file is refused whole with ArchiveFormatError (byte offset, field,
what was expected) and no byte of it reaches LLVM or a driver. Layout (little-endian)::

    header (88 bytes)
      0  magic "TMARCHIV"          8  u32 format version     12  u32 header size (88)
     16  u64 file size            24  u32 target count       28  u32 entry count
     32  u64 index offset         40  u64 index size         48  SHA-256 of the index
     80  u64 payload area offset
    index: targets, then entries
      target: str16 name ("cpu:x86-64-v3", "cuda:sm_90"), str32 toolchain, str16 features
      entry:  u16 target, str16 function name, 32-byte function HASH, str32 constants,
              str16 form, str16 symbol, u64 payload offset, u64 payload size, payload SHA-256
    payloads (objects, PTX, cubins), each inside the payload area

(strN: a uN byte length, then UTF-8). The file size sits at byte 16, as in a .metallib.
An entry is used only for the same target, toolchain, function HASH, constants and form
(``archived.py`` of each backend decides which of this process's are the same).
"""

import hashlib
import os
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..errors import ArchiveFormatError

__all__ = ["MAGIC", "VERSION", "Target", "Entry", "Archive", "read_archive", "write_archive"]

MAGIC = b"TMARCHIV"
VERSION = 1
_HEADER = struct.Struct("<8sIIQIIQQ32sQ")  # 88 bytes
_MAX_TEXT = 1 << 20  # no name, key or toolchain is near this; a larger length is damage


@dataclass(frozen=True)
class Target:
    name: str       # "cpu:x86-64-v3", "cuda:sm_90"
    toolchain: str  # what must be the same in the process that uses it
    features: Tuple[str, ...]  # CPU features the code needs (LLVM's names)


@dataclass(frozen=True)
class Entry:
    target: Target
    function: str   # the function's name (for listings and messages only)
    hash: str       # the function's HASH, hex
    constants: str  # the canonical constants text (compared, never evaluated)
    form: str       # "threads", "lanes", "coroutines", "+checked" variants; "ptx", "cubin" (+grid-only)
    symbol: str     # the name the object's entry points were built with
    offset: int
    size: int


class Archive:
    """A validated archive; `lookup` finds an entry's payload by its full key."""

    def __init__(self, data: bytes, description: str, targets: List[Target], entries: Dict[tuple, Entry]):
        self._data = data
        self.description = description
        self.targets = targets
        self.entries = entries

    def lookup(self, target: str, function_hash: str, constants: str, form: str) -> Optional[Tuple[Entry, bytes]]:
        entry = self.entries.get((target, function_hash, constants, form))
        if entry is None:
            return None
        return entry, self._data[entry.offset:entry.offset + entry.size]

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        names = ", ".join(dict.fromkeys(t.name for t in self.targets))  # a CUDA target's PTX and cubins: one name
        return f"<torch_metallib archive {self.description}: {len(self)} entries, {names}>"


class _Reader:
    """A cursor over the index that refuses to read past `end`."""

    def __init__(self, data: bytes, at: int, end: int, where: str):
        self.data, self.at, self.end, self.where = data, at, end, where

    def fail(self, field: str, expected: str, got: str, at: Optional[int] = None) -> ArchiveFormatError:
        at = self.at if at is None else at
        return ArchiveFormatError(f"archive {self.where}: {field} at byte offset {at}: expected {expected}, got {got}. "
                                  f"Rebuild it with `python -m torch_metallib precompile`", offset=at, field=field)

    def take(self, size: int, field: str) -> bytes:
        if size > self.end - self.at:
            raise self.fail(field, f"{size} bytes inside the index (ending at byte {self.end})",
                            f"{max(self.end - self.at, 0)} left")
        piece = self.data[self.at:self.at + size]
        self.at += size
        return piece

    def number(self, fmt: str, field: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), field))[0]

    def text(self, width: str, field: str) -> str:
        start = self.at
        size = self.number(width, f"{field} length")
        if size > _MAX_TEXT:
            raise self.fail(f"{field} length", f"at most {_MAX_TEXT}", str(size), start)
        raw = self.take(size, field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(field, "UTF-8 text", "other bytes", start) from None


def _open(source) -> Tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), f"({len(source)} bytes)"
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as file:
            return file.read(), os.fspath(source)
    raise TypeError(f"archives are paths or bytes; got {type(source).__name__}")


def read_archive(source) -> Archive:
    """The archive in `source` (bytes or a path), every field and payload checked.

    Raises:
        ArchiveFormatError: not a well-formed archive of a format version this one reads.
        OSError: the path cannot be read.
    """
    data, where = _open(source)
    header = _Reader(data, 0, len(data), where)
    if len(data) < _HEADER.size:
        raise header.fail("header", f"{_HEADER.size} bytes", f"a {len(data)}-byte file", 0)
    (magic, version, header_size, file_size, target_count, entry_count, index_offset, index_size, index_digest,
     payload_offset) = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise header.fail("magic", repr(MAGIC), repr(magic), 0)
    if version != VERSION:
        raise header.fail("format version", f"{VERSION} (this version reads no other)", str(version), 8)
    if header_size != _HEADER.size:
        raise header.fail("header size", str(_HEADER.size), str(header_size), 12)
    if file_size != len(data):
        raise header.fail("file size", f"the file's {len(data)} bytes", str(file_size), 16)
    if index_offset != _HEADER.size:
        raise header.fail("index offset", str(_HEADER.size), str(index_offset), 32)
    if index_size > file_size - index_offset:
        raise header.fail("index size", f"at most the {file_size - index_offset} bytes after the header",
                          str(index_size), 40)
    index_end = index_offset + index_size
    if payload_offset != index_end:
        raise header.fail("payload area offset", f"the index's end, {index_end}", str(payload_offset), 80)
    if hashlib.sha256(data[index_offset:index_end]).digest() != index_digest:
        raise header.fail("index SHA-256", f"the SHA-256 of bytes {index_offset} to {index_end}",
                          "a different digest", 48)
    index = _Reader(data, index_offset, index_end, where)
    # The smallest target is 8 bytes and the smallest entry 92: larger counts cannot fit.
    if target_count * 8 + entry_count * 92 > index_size:
        raise header.fail("target and entry counts", f"records that fit in the {index_size}-byte index",
                          f"{target_count} targets and {entry_count} entries", 24)
    targets = []
    for number in range(target_count):
        name = index.text("H", f"target {number} name")
        toolchain = index.text("I", f"target {number} toolchain")
        features = index.text("H", f"target {number} features")
        targets.append(Target(name, toolchain, tuple(f for f in features.split(",") if f)))
    entries = {}
    for number in range(entry_count):
        at = index.at
        target = index.number("H", f"entry {number} target")
        if target >= len(targets):
            raise index.fail(f"entry {number} target", f"a target number below {len(targets)}", str(target), at)
        function = index.text("H", f"entry {number} function name")
        function_hash = index.take(32, f"entry {number} function HASH").hex()
        constants = index.text("I", f"entry {number} constants")
        form = index.text("H", f"entry {number} form")
        symbol = index.text("H", f"entry {number} symbol")
        offset_at = index.at
        offset = index.number("Q", f"entry {number} payload offset")
        size = index.number("Q", f"entry {number} payload size")
        digest = index.take(32, f"entry {number} payload SHA-256")
        if offset < payload_offset or offset > file_size or size > file_size - offset:
            raise index.fail(f"entry {number} payload", f"bytes inside the payload area ({payload_offset} to "
                             f"{file_size})", f"{size} bytes at {offset}", offset_at)
        if hashlib.sha256(data[offset:offset + size]).digest() != digest:
            raise index.fail(f"entry {number} ({function}) payload SHA-256",
                             f"the SHA-256 of its {size} bytes at {offset}", "a different digest", offset_at + 16)
        key = (targets[target].name, function_hash, constants, form)
        if key in entries:
            raise index.fail(f"entry {number} ({function})", "one entry per target, HASH, constants and form",
                             "a second one", at)
        entries[key] = Entry(targets[target], function, function_hash, constants, form, symbol, offset, size)
    if index.at != index_end:
        raise index.fail("index end", f"the last entry to end at byte {index_end}", f"{index_end - index.at} bytes more")
    return Archive(data, where, targets, entries)


def _text(width: str, value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack("<" + width, len(raw)) + raw


def write_archive(targets: List[Target], entries: List[Tuple[Entry, bytes]]) -> bytes:
    """The bytes of an archive of `entries` ((entry, payload); the entry's offset and size
    are set here) for `targets`."""
    numbers = {target: number for number, target in enumerate(targets)}
    index = b"".join(_text("H", t.name) + _text("I", t.toolchain) + _text("H", ",".join(t.features)) for t in targets)
    records = []
    for entry, payload in entries:
        records.append(struct.pack("<H", numbers[entry.target]) + _text("H", entry.function) + bytes.fromhex(entry.hash)
                       + _text("I", entry.constants) + _text("H", entry.form) + _text("H", entry.symbol))
    index_size = len(index) + sum(len(r) + 48 for r in records)
    at = _HEADER.size + index_size
    payloads = []
    for record, (entry, payload) in zip(records, entries):
        index += record + struct.pack("<QQ", at, len(payload)) + hashlib.sha256(payload).digest()
        payloads.append(payload)
        at += len(payload)
    assert len(index) == index_size
    header = _HEADER.pack(MAGIC, VERSION, _HEADER.size, at, len(targets), len(entries), _HEADER.size, index_size,
                          hashlib.sha256(index).digest(), _HEADER.size + index_size)
    return header + index + b"".join(payloads)
