"""What lint needs from a module's bitcode that LLVM's reader hides: llvmlite's LLVM reads
old bitcode and upgrades it (typed pointers become ``ptr``, ``readnone`` becomes
``memory(none)``), so the pointer kinds, attribute kinds and producer as written are read
here from the bitstream itself (LLVM's bitstream container: abbreviations, blocks, records).

Only the blocks lint asks about are decoded (IDENTIFICATION, MODULE's VERSION, TYPE and
PARAMATTR_GROUP); every other block is skipped by its length.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

__all__ = ["BitcodeFacts", "read_facts", "BitstreamError"]

_IDENTIFICATION, _MODULE, _PARAMATTR_GROUP, _TYPE_NEW, _BLOCKINFO = 13, 8, 10, 17, 0
_TYPE_POINTER, _TYPE_OPAQUE_POINTER = 8, 25
_WRAPPER_MAGIC = b"\xde\xc0\x17\x0b"


class BitstreamError(ValueError):
    """The bytes are not a well-formed LLVM bitstream."""


@dataclass
class BitcodeFacts:
    """Attributes:
        producer: the IDENTIFICATION block's string ('' in Apple's modules), None if absent.
        epoch: the IDENTIFICATION block's epoch, None if absent.
        module_version: MODULE_CODE_VERSION (2 in Apple's modules: relative value ids).
        typed_pointers: how many typed pointer types (TYPE_CODE_POINTER) the type table has.
        opaque_pointers: how many opaque pointer types (TYPE_CODE_OPAQUE_POINTER).
        attribute_kinds: the enum attribute kinds (LLVM's ATTR_KIND_* numbers) the attribute
            groups use.
    """

    producer: Optional[str] = None
    epoch: Optional[int] = None
    module_version: Optional[int] = None
    typed_pointers: int = 0
    opaque_pointers: int = 0
    attribute_kinds: Set[int] = field(default_factory=set)


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0  # in bits
        self.end = len(data) * 8

    def read(self, width: int) -> int:
        if width == 0:
            return 0
        if self.pos + width > self.end:
            raise BitstreamError(f"read of {width} bits at bit {self.pos} runs past the end ({self.end} bits)")
        byte = self.pos >> 3
        window = int.from_bytes(self.data[byte:byte + (width + 14) // 8 + 1], "little")
        value = (window >> (self.pos & 7)) & ((1 << width) - 1)
        self.pos += width
        return value

    def vbr(self, width: int) -> int:
        value, shift, high = 0, 0, 1 << (width - 1)
        while True:
            piece = self.read(width)
            value |= (piece & (high - 1)) << shift
            if not piece & high:
                return value
            shift += width - 1
            if shift > 70:
                raise BitstreamError(f"VBR value at bit {self.pos} is too long")

    def align32(self) -> None:
        self.pos = (self.pos + 31) & ~31


def _define_abbrev(reader: _Reader) -> list:
    ops = []
    count = reader.vbr(5)
    while len(ops) < count:
        if reader.read(1):
            ops.append(("literal", reader.vbr(8)))
            continue
        encoding = reader.read(3)
        if encoding in (1, 2):
            ops.append(("fixed" if encoding == 1 else "vbr", reader.vbr(5)))
        elif encoding in (3, 4, 5):
            ops.append(({3: "array", 4: "char6", 5: "blob"}[encoding], 0))
        else:
            raise BitstreamError(f"abbreviation operand encoding {encoding} at bit {reader.pos}")
    return ops


def _scalar(reader: _Reader, op) -> int:
    kind, value = op
    if kind == "literal":
        return value
    if kind == "fixed":
        return reader.read(value)
    if kind == "vbr":
        return reader.vbr(value)
    if kind == "char6":
        return ord("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._"[reader.read(6)])
    raise BitstreamError(f"abbreviation operand {kind} where a scalar was expected")


def _record(reader: _Reader, abbrev: list) -> List[int]:
    values = []
    index = 0
    while index < len(abbrev):
        kind = abbrev[index][0]
        if kind == "array":
            element = abbrev[index + 1]
            values.extend(_scalar(reader, element) for _ in range(reader.vbr(6)))
            index += 2
        elif kind == "blob":
            length = reader.vbr(6)
            reader.align32()
            start = reader.pos >> 3
            values.extend(reader.data[start:start + length])
            reader.pos += length * 8
            reader.align32()
            index += 1
        else:
            values.append(_scalar(reader, abbrev[index]))
            index += 1
    return values


def _block(reader: _Reader, block_id: int, width: int, blockinfo: Dict[int, list], facts: BitcodeFacts) -> None:
    abbrevs = list(blockinfo.get(block_id, ()))
    info_target = None
    while True:
        if reader.pos >= reader.end:
            raise BitstreamError(f"block {block_id} is not closed")
        abbrev_id = reader.read(width)
        if abbrev_id == 0:  # END_BLOCK
            reader.align32()
            return
        if abbrev_id == 1:  # ENTER_SUBBLOCK
            child, child_width = reader.vbr(8), reader.vbr(4)
            reader.align32()
            words = reader.read(32)
            end = reader.pos + words * 32
            if child in (_MODULE, _TYPE_NEW, _PARAMATTR_GROUP, _IDENTIFICATION, _BLOCKINFO):
                _block(reader, child, child_width, blockinfo, facts)
            reader.pos = end
            continue
        if abbrev_id == 2:  # DEFINE_ABBREV
            abbrev = _define_abbrev(reader)
            if block_id == _BLOCKINFO:
                blockinfo.setdefault(info_target, []).append(abbrev)
            else:
                abbrevs.append(abbrev)
            continue
        if abbrev_id == 3:  # UNABBREV_RECORD
            code, count = reader.vbr(6), reader.vbr(6)
            values = [reader.vbr(6) for _ in range(count)]
        else:
            if abbrev_id - 4 >= len(abbrevs):
                raise BitstreamError(f"abbreviation {abbrev_id} undefined in block {block_id}")
            values = _record(reader, abbrevs[abbrev_id - 4])
            code, values = (values[0], values[1:]) if values else (0, [])
        if block_id == _BLOCKINFO and code == 1:  # SETBID
            info_target = values[0] if values else None
        else:
            _note(block_id, code, values, facts)


def _note(block_id: int, code: int, values: List[int], facts: BitcodeFacts) -> None:
    if block_id == _IDENTIFICATION:
        if code == 1:
            facts.producer = bytes(v & 0xFF for v in values).decode("latin-1")
        elif code == 2 and values:
            facts.epoch = values[0]
    elif block_id == _MODULE and code == 1 and values:
        facts.module_version = values[0]
    elif block_id == _TYPE_NEW:
        if code == _TYPE_POINTER:
            facts.typed_pointers += 1
        elif code == _TYPE_OPAQUE_POINTER:
            facts.opaque_pointers += 1
    elif block_id == _PARAMATTR_GROUP and code == 3:  # PARAMATTR_GRP_CODE_ENTRY: id, index, attrs...
        _attribute_kinds(values[2:], facts.attribute_kinds)


def _attribute_kinds(values: List[int], kinds: Set[int]) -> None:
    """Enum kinds of one group: 0 kind; 1 kind int; 3/4 string key [value] (0-terminated);
    5/6 type attribute kind [type]; 7 constant range (kind, width, bounds); 8 list."""
    index = 0
    while index < len(values):
        tag = values[index]
        if tag in (0, 1, 5, 6, 7):
            kinds.add(values[index + 1])
            if tag == 7:  # kind, bit width, then 2 words per bound for widths <= 64
                return  # the rest's layout depends on the width: only the kind matters here
            index += {0: 2, 1: 3, 5: 2, 6: 3}[tag]
        elif tag in (3, 4):
            index = values.index(0, index + 1) + 1
            if tag == 4:
                index = values.index(0, index) + 1
        else:
            return  # an encoding this reader does not know: stop rather than guess


def read_facts(bitcode: bytes) -> BitcodeFacts:
    """`bitcode`: raw (``BC`` 0xC0DE) or in Apple's wrapper.

    Raises:
        BitstreamError: not a bitstream, or one that ends or nests wrongly.
    """
    data = bytes(bitcode)
    if data[:4] == _WRAPPER_MAGIC:
        offset, size = int.from_bytes(data[8:12], "little"), int.from_bytes(data[12:16], "little")
        data = data[offset:offset + size]
    if data[:4] != b"BC\xc0\xde":
        raise BitstreamError(f"expected 'BC' 0xC0DE, got {data[:4].hex()}")
    reader = _Reader(data)
    reader.pos = 32
    facts = BitcodeFacts()
    blockinfo: Dict[int, list] = {}
    while reader.end - reader.pos >= 32 + 2:
        abbrev_id = reader.read(2)
        if abbrev_id != 1:
            raise BitstreamError(f"expected a block at the top level at bit {reader.pos - 2}, got abbreviation "
                                 f"{abbrev_id}")
        block_id, width = reader.vbr(8), reader.vbr(4)
        reader.align32()
        words = reader.read(32)
        end = reader.pos + words * 32
        if block_id in (_MODULE, _IDENTIFICATION, _BLOCKINFO):
            _block(reader, block_id, width, blockinfo, facts)
        reader.pos = end
    return facts
