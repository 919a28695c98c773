"""Malformed .metallib input: every check of the container reader, one named mutation each.

Each mutation parses a valid library with `struct` (header, section table, tag groups,
metadata groups, modules, reflection list), breaks exactly one field, and keeps every
other field consistent (sizes and offsets are fixed up after an insertion or deletion), so
the reader must report that field: a `MetallibFormatError` (a ValueError) whose message
names the field, the byte offset and what was expected (docs/formats.md and ARCHITECTURE.md, "Rules").
"""

import dataclasses
import struct
from typing import Callable, Dict, List, Optional, Tuple

import pytest

import torch_metallib as tm

# --- a small independent parser of the container layout ------------------------------

HEADER_SIZE = 88
SECTIONS = {"list": 24, "public": 40, "private": 56, "modules": 72}  # offset/size pair at
WIDE_TAGS = {b"RBUF", b"SBUF", b"SARC"}  # payload length is a u32, not a u16
U64_MAX = 2**64 - 1


@dataclasses.dataclass
class Tag:
    code: bytes
    offset: int  # the 4-byte code
    length_size: int  # 2, or 4 for WIDE_TAGS
    length: int

    @property
    def payload_at(self) -> int:
        return self.offset + 4 + self.length_size

    @property
    def end(self) -> int:
        return self.payload_at + self.length


@dataclasses.dataclass
class Group:
    """A tag group; `offset` is its u32 size field (None for the header extension)."""

    offset: Optional[int]
    end: int
    tags: List[Tag]
    endt: int  # offset of the ENDT code

    def tag(self, code: bytes) -> Tag:
        matches = [tag for tag in self.tags if tag.code == code]
        assert len(matches) == 1, f"expected one {code!r} tag, found {len(matches)}"
        return matches[0]

    def has(self, code: bytes) -> bool:
        return any(tag.code == code for tag in self.tags)


@dataclasses.dataclass
class Function:
    index: int
    name: bytes
    group: Group  # in the function list
    public: Group
    private: Group
    module_at: int  # absolute
    module_size: int
    reflection: Optional[Group]


def read_tags(data: bytes, begin: int, end: int) -> Tuple[List[Tag], int]:
    tags, at = [], begin
    while True:
        code = data[at : at + 4]
        if code == b"ENDT":
            assert at + 4 == end, "valid input: ENDT ends its group"
            return tags, at
        length_size = 4 if code in WIDE_TAGS else 2
        (length,) = struct.unpack_from("<I" if length_size == 4 else "<H", data, at + 4)
        tag = Tag(code, at, length_size, length)
        assert tag.end <= end, "valid input: tags stay inside their group"
        tags.append(tag)
        at = tag.end


def read_sized_group(data: bytes, at: int) -> Group:
    (size,) = struct.unpack_from("<I", data, at)
    tags, endt = read_tags(data, at + 4, at + size)
    return Group(at, at + size, tags, endt)


class Layout:
    """Where everything is in a valid library, found by parsing it."""

    def __init__(self, data: bytes):
        self.data = bytes(data)
        assert self.data[:4] == b"MTLB"
        self.file_size = self.u64(16)
        assert self.file_size == len(self.data)
        self.sections = {name: (self.u64(at), self.u64(at + 8)) for name, at in SECTIONS.items()}
        list_offset, list_size = self.sections["list"]
        self.count = self.u32(list_offset)
        self.list_begin = list_offset + 4
        self.list_end = self.list_begin + list_size  # the size excludes the u32 count

        public_offset = self.sections["public"][0]
        self.extension = None
        if self.list_end < public_offset:
            tags, endt = read_tags(self.data, self.list_end, public_offset)
            self.extension = Group(None, public_offset, tags, endt)
        self.rlst = None  # (offset, size) of the reflection list
        if self.extension is not None and self.extension.has(b"RLST"):
            self.rlst = struct.unpack_from("<QQ", self.data, self.extension.tag(b"RLST").payload_at)

        self.functions: List[Function] = []
        at = self.list_begin
        for index in range(self.count):
            group = read_sized_group(self.data, at)
            name_tag = group.tag(b"NAME")
            name = self.data[name_tag.payload_at : name_tag.end - 1]
            offsets = struct.unpack_from("<3Q", self.data, group.tag(b"OFFT").payload_at)
            (module_size,) = struct.unpack_from("<Q", self.data, group.tag(b"MDSZ").payload_at)
            reflection = None
            if group.has(b"RFLT"):
                (relative,) = struct.unpack_from("<Q", self.data, group.tag(b"RFLT").payload_at)
                reflection = read_sized_group(self.data, self.rlst[0] + relative)
            self.functions.append(Function(
                index, name, group,
                read_sized_group(self.data, self.sections["public"][0] + offsets[0]),
                read_sized_group(self.data, self.sections["private"][0] + offsets[1]),
                self.sections["modules"][0] + offsets[2], module_size, reflection))
            at = group.end
        assert at == self.list_end

    def u32(self, at: int) -> int:
        return struct.unpack_from("<I", self.data, at)[0]

    def u64(self, at: int) -> int:
        return struct.unpack_from("<Q", self.data, at)[0]

    def section_end(self, name: str) -> int:
        offset, size = self.sections[name]
        return offset + size + (4 if name == "list" else 0)

    def fn(self, index: int) -> Function:
        return self.functions[index]

    def with_constants(self) -> Function:
        return next(f for f in self.functions if f.public.has(b"CNST"))

    def with_reflection(self) -> Function:
        return next(f for f in self.functions if f.reflection is not None)


def put(data: bytes, at: int, fmt: str, *values) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, *values)
    return bytes(out)


def tag_bytes(code: bytes, payload: bytes, length: Optional[int] = None) -> bytes:
    length = len(payload) if length is None else length
    return code + struct.pack("<I" if code in WIDE_TAGS else "<H", length) + payload


def splice(layout: Layout, at: int, remove: int, insert: bytes) -> bytes:
    """Replaces data[at:at+remove] by `insert` inside one group and fixes up every size and
    offset that depends on the move (file size, section table, the size of each enclosing
    group, OFFT/MDSZ, RLST and RFLT), so only the edited field is wrong."""
    delta = len(insert) - remove
    data = layout.data

    def start(position: int) -> int:  # where a range that begins at `position` moves
        return position + delta if position >= at + remove else position

    def end(position: int) -> int:  # where a range that ends at `position` moves
        return position + delta if position > at else position

    def removed(position: int) -> bool:
        return at <= position < at + remove

    out = bytearray(data[:at] + insert + data[at + remove :])
    writes = [(16, "<Q", len(out))]
    new_sections = {}
    for name, field_at in SECTIONS.items():
        offset = layout.sections[name][0]
        new_offset, new_end = start(offset), end(layout.section_end(name))
        new_sections[name] = new_offset
        writes.append((field_at, "<QQ", new_offset,
                       new_end - new_offset - (4 if name == "list" else 0)))

    groups = [g for f in layout.functions for g in (f.group, f.public, f.private, f.reflection) if g]
    for group in groups:
        if not removed(group.offset):
            writes.append((start(group.offset), "<I", end(group.end) - start(group.offset)))
    new_rlst = None
    if layout.rlst is not None:
        rlst_tag = layout.extension.tag(b"RLST")
        new_rlst = start(layout.rlst[0])
        if not removed(rlst_tag.offset):
            writes.append((start(rlst_tag.payload_at), "<QQ", new_rlst,
                           end(layout.rlst[0] + layout.rlst[1]) - new_rlst))
    for f in layout.functions:
        offt = f.group.tag(b"OFFT")
        if not removed(offt.offset):
            writes.append((start(offt.payload_at), "<3Q",
                           start(f.public.offset) - new_sections["public"],
                           start(f.private.offset) - new_sections["private"],
                           start(f.module_at) - new_sections["modules"]))
        mdsz = f.group.tag(b"MDSZ")
        if not removed(mdsz.offset):
            writes.append((start(mdsz.payload_at), "<Q",
                           end(f.module_at + f.module_size) - start(f.module_at)))
        if f.reflection is not None:
            rflt = f.group.tag(b"RFLT")
            if not removed(rflt.offset):
                writes.append((start(rflt.payload_at), "<Q", start(f.reflection.offset) - new_rlst))
    for field_at, fmt, *values in writes:
        struct.pack_into(fmt, out, field_at, *values)
    return bytes(out)


def replace_tag(layout: Layout, tag: Tag, new_tag: bytes) -> bytes:
    return splice(layout, tag.offset, tag.end - tag.offset, new_tag)


def replace_payload(layout: Layout, tag: Tag, payload: bytes) -> bytes:
    return replace_tag(layout, tag, tag_bytes(tag.code, payload))


def remove_tag(layout: Layout, tag: Tag) -> bytes:
    return splice(layout, tag.offset, tag.end - tag.offset, b"")


# --- the malformations -----------------------------------------------------------------
# Each returns (bad bytes, the byte offset the error must name: an int, a [lo, hi) range,
# or None when the check below only bounds it to [0, len(data)]).

Mutation = Callable[[Layout], Tuple[bytes, object]]


@dataclasses.dataclass
class Bad:
    id: str
    source: str  # "fixture": the project's packed kernels; "apple": an Apple-built subset
    mutate: Mutation
    words: Tuple[str, ...]  # must all appear in the message
    # "load": tm.load raises. "use": load (which reads the function list only) succeeds,
    # using the function (lib[name]) raises, and so do to_bytes() and verify.
    # "bitcode": load succeeds, the function's .bitcode raises,
    # and so do verify=True and lib.verify(). "verify": only the SHA-256 check (verify)
    # raises. "reflection": load succeeds, to_bytes(), subset() and verify raise.
    when: str = "load"


def header_u16(at: int, value: int) -> Mutation:
    return lambda L: (put(L.data, at, "<H", value), at)


def header_u8(at: int, value: int) -> Mutation:
    return lambda L: (put(L.data, at, "<B", value), at)


def header_u64(at: int, value: Callable[[Layout], int], error_at: Optional[int] = None) -> Mutation:
    return lambda L: (put(L.data, at, "<Q", value(L)), at if error_at is None else error_at)


def section_pair(name: str, offset: Callable, size: Callable) -> Mutation:
    at = SECTIONS[name]
    return lambda L: (put(L.data, at, "<QQ", offset(L), size(L)), at)


def truncate(boundary: Callable[[Layout], int], keep_size: bool,
             error_at: Callable[[Layout], int] = lambda L: None) -> Mutation:
    def mutate(L: Layout):
        cut = boundary(L)
        assert 0 < cut < len(L.data)
        data = L.data[:cut]
        if keep_size:
            return data, 16
        return put(data, 16, "<Q", cut), error_at(L)
    return mutate


def function_tag(index, code: bytes, fmt: str, value: Callable, payload_at: int = 0) -> Mutation:
    def mutate(L: Layout):
        tag = L.fn(index).group.tag(code)
        return put(L.data, tag.payload_at + payload_at, fmt, value(L)), tag.offset
    return mutate


def group_size(index, value: Callable[[Layout, Group], int]) -> Mutation:
    def mutate(L: Layout):
        group = L.fn(index).group
        return put(L.data, group.offset, "<I", value(L, group)), group.offset
    return mutate


def name_payload(payload: bytes) -> Mutation:
    def mutate(L: Layout):
        tag = L.fn(0).group.tag(b"NAME")
        return replace_payload(L, tag, payload), tag.offset
    return mutate


def missing_tag(code: bytes) -> Mutation:
    def mutate(L: Layout):
        group = L.fn(0).group
        return remove_tag(L, group.tag(code)), group.offset
    return mutate


def tag_length(code: bytes, length: int) -> Mutation:
    """Gives a fixed-size function-list tag `length` payload bytes (fixed up consistently)."""
    def mutate(L: Layout):
        tag = L.fn(0).group.tag(code)
        payload = L.data[tag.payload_at : tag.end]
        payload = (payload + bytes(length))[:length]
        return replace_payload(L, tag, payload), tag.offset
    return mutate


def offt(index: int, slot: int, value: Callable[[Layout, Function], int]) -> Mutation:
    """Sets OFFT slot 0 (public md), 1 (private md) or 2 (module section)."""
    def mutate(L: Layout):
        f = L.fn(index)
        tag = f.group.tag(b"OFFT")
        return put(L.data, tag.payload_at + 8 * slot, "<Q", value(L, f)), tag.offset
    return mutate


def module_field(index, at: int, fmt: str, value: Callable[[Layout, Function], object],
                 error_delta: int) -> Mutation:
    def mutate(L: Layout):
        f = L.fn(index)
        return put(L.data, f.module_at + at, fmt, value(L, f)), f.module_at + error_delta
    return mutate


def constants(payload: Callable[[bytes], bytes], error_delta: Callable[[bytes], int]) -> Mutation:
    """Rewrites the CNST payload of the function that has function constants."""
    def mutate(L: Layout):
        tag = L.with_constants().public.tag(b"CNST")
        old = L.data[tag.payload_at : tag.end]
        return replace_payload(L, tag, payload(old)), tag.payload_at + error_delta(old)
    return mutate


def cnst_second_constant_at(payload: bytes) -> int:
    return payload.index(b"\0", 2) + 5


def missing_endt(group_of: Callable[[Layout], Group]) -> Mutation:
    def mutate(L: Layout):
        group = group_of(L)
        return splice(L, group.endt, 4, b""), group.endt
    return mutate


def endt_leftover(L: Layout):
    """ENDT, 4 more bytes, then the original ENDT: inserted before the group's end so the
    group (not the next one) grows."""
    group = L.fn(0).group
    return splice(L, group.endt, 0, b"ENDT" + b"\0" * 4), group.endt


def duplicate_tag(L: Layout):
    tag = L.fn(0).group.tag(b"TYPE")
    copy = L.data[tag.offset : tag.end]
    return splice(L, tag.end, 0, copy), tag.end


def duplicate_name(L: Layout):
    first, second = L.fn(0), L.fn(1)
    return replace_payload(L, second.group.tag(b"NAME"), first.name + b"\0"), second.group.offset


def non_utf8_duplicate_name(L: Layout):
    """Two functions named b'\\xff\\xfek': the message quotes a name that is not UTF-8."""
    name = b"\xff\xfek\0"
    first = Layout(replace_payload(L, L.fn(0).group.tag(b"NAME"), name))
    return replace_payload(first, first.fn(1).group.tag(b"NAME"), name), first.fn(1).group.offset


def non_utf8_name_bad_wrapper(L: Layout):
    """A lazily found error in a function whose name is not UTF-8."""
    renamed = Layout(replace_payload(L, L.fn(0).group.tag(b"NAME"), b"\xff\xfek\0"))
    return put(renamed.data, renamed.fn(0).module_at, "<I", 0), renamed.fn(0).module_at


def metadata_group(kind: str, value: Callable[[Layout, Group], int]) -> Mutation:
    def mutate(L: Layout):
        group = getattr(L.fn(0), kind)
        return put(L.data, group.offset, "<I", value(L, group)), group.offset
    return mutate


def extension_tag(code: bytes, fmt: str, value: Callable[[Layout, Tag], object],
                  at: int = 0) -> Mutation:
    def mutate(L: Layout):
        tag = L.extension.tag(code)
        return put(L.data, tag.payload_at + at, fmt, value(L, tag)), tag.offset
    return mutate


def uuid_length(length: int) -> Mutation:
    def mutate(L: Layout):
        tag = L.extension.tag(b"UUID")
        return replace_payload(L, tag, L.data[tag.payload_at : tag.payload_at + length]), tag.offset
    return mutate


def remove_rlst(L: Layout):
    rflt = L.with_reflection().group.tag(b"RFLT")
    return remove_tag(L, L.extension.tag(b"RLST")), rflt.offset  # RFLT comes first: it stays


def rflt(value: Callable[[Layout], int]) -> Mutation:
    def mutate(L: Layout):
        tag = L.with_reflection().group.tag(b"RFLT")
        return put(L.data, tag.payload_at, "<Q", value(L)), tag.offset
    return mutate


def reflection_group(value: Callable[[Layout, Group], int]) -> Mutation:
    def mutate(L: Layout):
        group = L.with_reflection().reflection
        return put(L.data, group.offset, "<I", value(L, group)), group.offset
    return mutate


def rbuf_length(L: Layout):
    group = L.with_reflection().reflection
    tag = group.tag(b"RBUF")
    return put(L.data, tag.offset + 4, "<I", 0xFFFFFFF0), tag.offset


def flip(at: Callable[[Layout], int], error_at: Callable[[Layout], int]) -> Mutation:
    def mutate(L: Layout):
        position = at(L)
        out = bytearray(L.data)
        out[position] ^= 0x01
        return bytes(out), error_at(L)
    return mutate


def in_group(index: int) -> Callable[[Layout], Tuple[int, int]]:
    """A HASH mismatch is reported somewhere in the function's group: [offset, end)."""
    return lambda L: (L.fn(index).group.offset, L.fn(index).group.end)


def section(name: str) -> Callable[[Layout], int]:
    return lambda L: L.sections[name][0]


def after_module(index: int) -> Callable[[Layout], int]:
    return lambda L: L.fn(index).module_at + L.fn(index).module_size


def mid_module(L: Layout) -> int:
    return L.fn(1).module_at + L.fn(1).module_size // 2


def rlst_tag_at(L: Layout) -> int:
    return L.extension.tag(b"RLST").offset


TRUNCATIONS = [
    # (id, source, where to cut, words when the file size is fixed up, error offset then)
    ("after-header", "fixture", lambda L: HEADER_SIZE, ("function list count",), lambda L: 24),
    ("inside-function-list", "fixture", lambda L: L.fn(1).group.offset + 3,
     ("function list", "inside the"), lambda L: 24),
    ("end-of-function-list", "fixture", lambda L: L.list_end,
     ("public metadata section",), lambda L: 40),
    ("end-of-header-extension", "fixture", section("public"),
     ("public metadata section",), lambda L: 40),
    ("end-of-public-metadata", "fixture", lambda L: L.section_end("public"),
     ("private metadata section",), lambda L: 56),
    ("end-of-private-metadata", "fixture", lambda L: L.section_end("private"),
     ("module section",), lambda L: 72),
    ("end-of-first-module", "fixture", after_module(0), ("module section",), lambda L: 72),
    ("mid-module", "fixture", mid_module, ("module section",), lambda L: 72),
    ("end-of-last-module-before-trailing-byte", "fixture", lambda L: len(L.data) - 1,
     ("module section",), lambda L: 72),
    ("end-of-modules", "apple", lambda L: L.section_end("modules"),
     ("header extension RLST section",), rlst_tag_at),
    ("mid-reflection-list", "apple", lambda L: L.rlst[0] + L.rlst[1] // 2,
     ("header extension RLST section",), rlst_tag_at),
]

CASES = [
    # --- header -------------------------------------------------------------------------
    Bad("empty-input", "fixture", lambda L: (b"", 0), ("header", "88 bytes")),
    Bad("bad-magic", "fixture", lambda L: (b"MTLC" + L.data[4:], 0), ("magic", "'MTLB'", "got 4D 54 4C 43")),
    Bad("magic-not-utf8", "fixture", lambda L: (b"\xff\xfe\xfd\xfc" + L.data[4:], 0), ("magic", "'MTLB'")),
    Bad("zeroed-magic", "fixture", lambda L: (bytes(4) + L.data[4:], 0), ("magic", "'MTLB'")),
    Bad("format-major-2", "fixture", header_u16(4, 0x8002), ("format major version", "got 2")),
    Bad("format-major-0-no-macos-bit", "fixture", header_u16(4, 0), ("format major version", "got 0")),
    Bad("file-type-4", "fixture", header_u8(10, 4), ("file type", "got 4")),
    Bad("file-type-0xff", "fixture", header_u8(10, 0xFF), ("file type", "got 255")),
    Bad("file-size-larger", "fixture", header_u64(16, lambda L: len(L.data) + 1), ("file size",)),
    Bad("file-size-smaller", "fixture", header_u64(16, lambda L: len(L.data) - 1), ("file size",)),
    Bad("file-size-zero", "fixture", header_u64(16, lambda L: 0), ("file size", "got 0")),
    Bad("file-size-u64-max", "fixture", header_u64(16, lambda L: U64_MAX), ("file size",)),
    # --- section table ------------------------------------------------------------------
    Bad("public-md-offset-past-end", "fixture",
        section_pair("public", lambda L: len(L.data) + 1, lambda L: 8),
        ("public metadata section", "inside the")),
    Bad("module-size-past-end", "fixture",
        section_pair("modules", section("modules"), lambda L: L.sections["modules"][1] + 16),
        ("module section", "inside the")),
    Bad("function-list-size-past-end", "fixture",
        section_pair("list", section("list"), lambda L: len(L.data)), ("function list", "inside the")),
    Bad("function-list-offset-near-2**64", "fixture",
        section_pair("list", lambda L: U64_MAX - 1, lambda L: L.sections["list"][1]),
        ("function list count", "inside the")),
    Bad("function-list-size-2**64-1", "fixture",
        section_pair("list", section("list"), lambda L: U64_MAX), ("function list", "inside the")),
    Bad("public-md-offset-plus-size-overflows", "fixture",
        section_pair("public", lambda L: U64_MAX - 7, lambda L: 16),
        ("public metadata section", "inside the")),
    Bad("module-size-2**64-1", "fixture",
        section_pair("modules", section("modules"), lambda L: U64_MAX), ("module section",)),
    Bad("function-list-inside-header", "fixture",
        section_pair("list", lambda L: 80, lambda L: L.sections["list"][1]),
        ("function list offset", "header")),
    Bad("private-md-overlaps-public-md", "fixture",
        section_pair("private", lambda L: L.sections["public"][0] + 4, lambda L: 8),
        ("private metadata section offset", "public metadata section", "overlap")),
    Bad("public-and-private-md-swapped", "fixture",
        lambda L: (put(L.data, 40, "<4Q", *L.sections["private"], *L.sections["public"]), 56),
        ("private metadata section offset", "overlap")),
    Bad("modules-before-private-md", "fixture",
        section_pair("modules", section("private"), lambda L: L.sections["modules"][1]),
        ("module section offset", "private metadata section")),
    # --- function list ------------------------------------------------------------------
    Bad("function-count-exceeds-list-capacity", "fixture",
        lambda L: (put(L.data, L.sections["list"][0], "<I", L.sections["list"][1] // 8 + 1),
                   L.sections["list"][0]), ("function count", "at most")),
    Bad("function-count-u32-max", "fixture",
        lambda L: (put(L.data, L.sections["list"][0], "<I", 0xFFFFFFFF), L.sections["list"][0]),
        ("function count", "4294967295")),
    Bad("function-count-one-more-than-groups", "fixture",
        lambda L: (put(L.data, L.sections["list"][0], "<I", L.count + 1), L.sections["list"][0]),
        ("function count", "expected 5 (the groups", "got 6")),
    Bad("function-count-zero-with-groups", "fixture",
        lambda L: (put(L.data, L.sections["list"][0], "<I", 0), L.list_begin),
        ("function list size", "0 groups")),
    Bad("function-count-one-fewer-than-groups", "fixture",
        lambda L: (put(L.data, L.sections["list"][0], "<I", L.count - 1), L.fn(L.count - 1).group.offset),
        ("function list size",)),
    Bad("group-size-0", "fixture", group_size(0, lambda L, g: 0), ("function 0 function-list group size", "got 0")),
    Bad("group-size-4", "fixture", group_size(0, lambda L, g: 4), ("function 0 function-list group size", "got 4")),
    Bad("group-size-past-list", "fixture",
        group_size(-1, lambda L, g: L.list_end - g.offset + 1), ("function 4 function-list group size",)),
    Bad("group-size-u32-max", "fixture", group_size(0, lambda L, g: 0xFFFFFFFF),
        ("function 0 function-list group size",)),
    Bad("group-size-cuts-last-tag", "fixture",
        lambda L: (put(L.data, L.fn(0).group.offset, "<I", L.fn(0).group.end - L.fn(0).group.offset - 6),
                   L.fn(0).group.tag(b"MDSZ").offset),
        ("function 0 function-list group tag MDSZ",)),
    Bad("name-length-past-group", "fixture", function_tag(0, b"NAME", "<H", lambda L: 0xFFFF, -2),
        ("function 0 function-list group tag NAME", "65535")),
    Bad("missing-endt", "fixture", missing_endt(lambda L: L.fn(0).group),
        ("function 0 function-list group", "ENDT")),
    Bad("endt-followed-by-leftover-bytes", "fixture", endt_leftover,
        ("function 0 function-list group ENDT", "8 bytes")),
    Bad("name-without-nul", "fixture",
        lambda L: (put(L.data, L.fn(0).group.tag(b"NAME").end - 1, "<B", ord("x")),
                   L.fn(0).group.tag(b"NAME").offset),
        ("function 0 function-list group NAME", "NUL")),
    Bad("name-interior-nul", "fixture",
        lambda L: (put(L.data, L.fn(0).group.tag(b"NAME").payload_at + 3, "<B", 0),
                   L.fn(0).group.tag(b"NAME").offset),
        ("function 0 function-list group NAME", "NUL", "byte 3")),
    Bad("name-empty", "fixture", name_payload(b"\0"), ("function 0 function-list group NAME", "non-empty")),
    Bad("name-zero-length-payload", "fixture", name_payload(b""), ("function 0 function-list group NAME", "NUL")),
    Bad("duplicate-function-names", "fixture", duplicate_name,
        ("function 1 'function_constant_scale' function-list group NAME", "unique", "function 0")),
    Bad("duplicate-non-utf8-names", "fixture", non_utf8_duplicate_name,
        ("function 1", "function-list group NAME", "function 0")),
    Bad("duplicate-type-tag", "fixture", duplicate_tag,
        ("function 0 function-list group tag TYPE", "at most one")),
    Bad("missing-name-tag", "fixture", missing_tag(b"NAME"), ("function 0 function-list group", "NAME")),
    Bad("missing-type-tag", "fixture", missing_tag(b"TYPE"), ("function 0", "function-list group", "TYPE")),
    Bad("missing-hash-tag", "fixture", missing_tag(b"HASH"), ("function 0", "function-list group", "HASH")),
    Bad("missing-offt-tag", "fixture", missing_tag(b"OFFT"), ("function 0", "function-list group", "OFFT")),
    Bad("missing-mdsz-tag", "fixture", missing_tag(b"MDSZ"), ("function 0", "function-list group", "MDSZ")),
    Bad("type-length-2", "fixture", tag_length(b"TYPE", 2), ("function 0 function-list group tag TYPE length", "expected 1 byte,", "got 2 bytes")),
    Bad("hash-length-31", "fixture", tag_length(b"HASH", 31), ("tag HASH length", "32 bytes")),
    Bad("offt-length-16", "fixture", tag_length(b"OFFT", 16), ("tag OFFT length", "24 bytes")),
    Bad("mdsz-length-4", "fixture", tag_length(b"MDSZ", 4), ("tag MDSZ length", "8 bytes")),
    Bad("vers-length-0", "fixture", tag_length(b"VERS", 0), ("tag VERS length", "8 bytes")),
    # --- OFFT / MDSZ ranges -------------------------------------------------------------
    Bad("offt-public-past-public-md", "fixture",
        offt(0, 0, lambda L, f: L.sections["public"][1]),
        ("function 0 'function_constant_scale' public metadata offset (OFFT)",)),
    Bad("offt-private-past-private-md", "fixture",
        offt(1, 1, lambda L, f: L.sections["private"][1] - 2),
        ("function 1 'scale_shift_float' private metadata offset (OFFT)",), when="use"),
    Bad("offt-public-near-2**64", "fixture", offt(0, 0, lambda L, f: U64_MAX - 1),
        ("public metadata offset (OFFT)",)),
    Bad("module-range-past-module-section", "fixture",
        lambda L: (put(L.data, L.fn(-1).group.tag(b"MDSZ").payload_at, "<Q", L.fn(-1).module_size + 16),
                   L.fn(-1).group.tag(b"OFFT").offset),
        ("function 4 'vector_add_float'", "module range (OFFT/MDSZ)", "module section")),
    Bad("module-offset-past-module-section", "fixture",
        offt(2, 2, lambda L, f: L.sections["modules"][1] + 16), ("module range (OFFT/MDSZ)",)),
    Bad("module-offset-plus-size-overflows", "fixture",
        offt(2, 2, lambda L, f: U64_MAX - 15), ("module range (OFFT/MDSZ)",)),
    Bad("two-modules-same-offset", "fixture",
        lambda L: (put(L.data, L.fn(1).group.tag(b"OFFT").payload_at + 16, "<Q",
                       L.fn(0).module_at - L.sections["modules"][0]), L.fn(0).module_at),
        ("function 1 'scale_shift_float' module", "disjoint", "function 0")),
    Bad("module-overlaps-next-module", "fixture",
        lambda L: (put(L.data, L.fn(0).group.tag(b"MDSZ").payload_at, "<Q", L.fn(0).module_size + 16),
                   L.fn(1).module_at),
        ("function 1 'scale_shift_float' module", "disjoint")),
    # --- public / private metadata --------------------------------------------------------
    Bad("public-md-group-size-0", "fixture", metadata_group("public", lambda L, g: 0),
        ("function 0 'function_constant_scale' public metadata group size", "got 0")),
    Bad("private-md-group-size-past-section", "fixture",
        metadata_group("private", lambda L, g: L.section_end("private") - g.offset + 4),
        ("private metadata group size",)),
    Bad("public-md-missing-endt", "fixture", missing_endt(lambda L: L.with_constants().public),
        ("function 0 'function_constant_scale' public metadata", "ENDT")),
    Bad("cnst-truncated-constant", "fixture",
        constants(lambda p: p[:-2], cnst_second_constant_at), ("function 0 'function_constant_scale' public metadata CNST constant 1",)),
    Bad("cnst-count-larger-than-constants", "fixture",
        constants(lambda p: struct.pack("<H", 3) + p[2:], lambda p: len(p)), ("CNST constant 2",)),
    Bad("cnst-leftover-bytes", "fixture",
        constants(lambda p: struct.pack("<H", 1) + p[2:], cnst_second_constant_at),
        ("function 0 'function_constant_scale' public metadata CNST", "1 constants")),
    Bad("cnst-empty-payload", "fixture", constants(lambda p: b"", lambda p: 0), ("CNST count",)),
    # --- header extension / reflection list -------------------------------------------------
    Bad("extension-missing-endt", "fixture", missing_endt(lambda L: L.extension),
        ("header extension", "ENDT")),
    Bad("extension-uuid-length-15", "fixture", uuid_length(15), ("header extension tag UUID length", "16 bytes")),
    Bad("extension-tag-length-past-group", "fixture",
        extension_tag(b"UUID", "<H", lambda L, t: 0x1000, at=-2), ("header extension tag UUID", "4096")),
    Bad("rlst-overlaps-modules", "apple",
        extension_tag(b"RLST", "<Q", lambda L, t: L.sections["modules"][0] + 16),
        ("header extension RLST section offset", "module section")),
    Bad("rlst-size-past-end", "apple",
        extension_tag(b"RLST", "<Q", lambda L, t: L.rlst[1] + 1, at=8),
        ("header extension RLST section", "inside the")),
    Bad("rlst-offset-near-2**64", "apple", extension_tag(b"RLST", "<Q", lambda L, t: U64_MAX - 3),
        ("header extension RLST section", "inside the")),
    Bad("rflt-past-reflection-list", "apple", rflt(lambda L: L.rlst[1]),
        ("function 0 'vv_Addfloat32' reflection-list group RFLT offset", "reflection list")),
    Bad("rflt-near-2**64", "apple", rflt(lambda L: U64_MAX), ("RFLT offset",)),
    Bad("rflt-without-rlst", "apple", remove_rlst, ("function 0 'vv_Addfloat32' reflection-list group RFLT", "RLST")),
    Bad("rflt-length-4", "apple",
        lambda L: (replace_payload(L, L.fn(0).group.tag(b"RFLT"), bytes(4)), L.fn(0).group.tag(b"RFLT").offset),
        ("tag RFLT length", "8 bytes")),
    # --- lazily checked: module wrapper, bitcode magic, HASH (all on first use of the
    # function's bitcode, before LLVM sees it), reflection groups --------------------------
    Bad("wrapper-magic", "fixture", module_field(1, 0, "<I", lambda L, f: 0x0B17C0DF, 0),
        ("function 1 'scale_shift_float' module wrapper magic", "0x0B17C0DE", "0x0B17C0DF"), when="bitcode"),
    Bad("wrapper-magic-in-non-utf8-named-function", "fixture", non_utf8_name_bad_wrapper,
        ("function 0", "module wrapper magic"), when="bitcode"),
    Bad("wrapper-bitcode-size-exceeds-mdsz", "fixture",
        module_field(1, 12, "<I", lambda L, f: f.module_size, 8),
        ("function 1 'scale_shift_float' module wrapper bitcode range", "MDSZ"), when="bitcode"),
    Bad("wrapper-bitcode-offset-below-20", "fixture", module_field(1, 8, "<I", lambda L, f: 16, 8),
        ("function 1 'scale_shift_float' module wrapper bitcode range", "20"), when="bitcode"),
    Bad("bitcode-magic", "fixture", module_field(1, 20, "<2s", lambda L, f: b"XC", 20),
        ("function 1 'scale_shift_float' module bitcode magic", "'BC' 0xC0DE"), when="bitcode"),
    Bad("mdsz-smaller-than-wrapper", "fixture",
        lambda L: (put(L.data, L.fn(-1).group.tag(b"MDSZ").payload_at, "<Q", 16), L.fn(-1).module_at),
        ("function 4 'vector_add_float' module size (MDSZ)", "24 bytes"), when="bitcode"),
    Bad("hash-tag-mismatch", "fixture",
        flip(lambda L: L.fn(2).group.tag(b"HASH").payload_at + 5, in_group(2)),
        ("function 2 'struct_arg_axpy' HASH", "SHA-256"), when="bitcode"),
    Bad("hash-module-byte-flipped", "fixture",
        flip(lambda L: L.fn(3).module_at + 100, in_group(3)),
        ("function 3 'threadgroup_sum_float' HASH", "SHA-256"), when="bitcode"),
    Bad("apple-hash-mismatch", "apple",
        flip(lambda L: L.fn(1).module_at + L.fn(1).module_size - 1, in_group(1)),
        ("function 1", "HASH"), when="bitcode"),
    Bad("reflection-group-size-0", "apple", reflection_group(lambda L, g: 0),
        ("function 0 'vv_Addfloat32' reflection-list group size", "got 0"), when="reflection"),
    Bad("reflection-group-size-past-list", "apple",
        reflection_group(lambda L, g: L.rlst[0] + L.rlst[1] - g.offset + 1),
        ("function 0 'vv_Addfloat32' reflection-list group size", "reflection list"), when="reflection"),
    Bad("reflection-rbuf-length-past-group", "apple", rbuf_length,
        ("function 0 'vv_Addfloat32' reflection-list group tag RBUF",), when="reflection"),
]
for _id, _source, _cut, _words, _error_at in TRUNCATIONS:
    CASES.append(Bad(f"truncated-{_id}-file-size-kept", _source, truncate(_cut, True),
                     ("file size", "length of the data")))
    CASES.append(Bad(f"truncated-{_id}-file-size-adjusted", _source,
                     truncate(_cut, False, _error_at), _words))

assert len({case.id for case in CASES}) == len(CASES)

# --- valid inputs ----------------------------------------------------------------------

APPLE_KERNELS = ("vv_Addfloat32", "vv_Addfloat16", "arange_float32")


def apple_kernel_names(lib: tm.Library) -> List[str]:
    """APPLE_KERNELS where present, else close spellings (e.g. 'arangefloat32')."""
    names = []
    for wanted in APPLE_KERNELS:
        if wanted in lib:
            names.append(wanted)
            continue
        squeezed = [name for name in lib.function_names if name == wanted.replace("_", "", 1)]
        assert squeezed, f"no kernel like {wanted!r} in the corpus"
        names.append(squeezed[0])
    return names


@pytest.fixture(scope="module")
def apple_bytes(mlx_lib) -> bytes:
    return mlx_lib.subset(apple_kernel_names(mlx_lib))


@pytest.fixture(scope="module")
def layouts(request) -> Dict[str, Layout]:
    """Parsed valid inputs, created on first use so fixture-only cases need no corpus."""
    cache: Dict[str, Layout] = {}

    def get(source: str) -> Layout:
        if source not in cache:
            data = request.getfixturevalue("fixture_metallib" if source == "fixture" else "apple_bytes")
            tm.load(data, verify=True)  # the starting point is valid
            cache[source] = Layout(data)
        return cache[source]

    return get


# --- the tests -------------------------------------------------------------------------

def check_error(error: tm.MetallibFormatError, data: bytes, words, offset,
                strict_format: bool = True):
    message = str(error)
    assert isinstance(error, ValueError)
    assert isinstance(error.offset, int) and 0 <= error.offset <= len(data), (error.offset, message)
    if isinstance(offset, tuple):
        assert offset[0] <= error.offset < offset[1], (offset, message)
    elif offset is not None:
        assert error.offset == offset, message
    assert isinstance(error.field, str) and error.field, message
    assert "expected" in message and error.field.split()[0] in message, message
    if strict_format:
        prefix = f"metallib: {error.field} at byte offset {error.offset}: expected "
        assert message.startswith(prefix) and ", got " in message, message
    for word in words:
        assert word in message, f"{word!r} not in: {message}"


def raises(call, data, words, offset, strict_format=True) -> str:
    with pytest.raises(tm.MetallibFormatError) as info:
        call()
    check_error(info.value, data, words, offset, strict_format)
    return str(info.value)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_malformed_input_is_rejected(case: Bad, layouts):
    layout = layouts(case.source)
    data, offset = case.mutate(layout)
    assert data != layout.data
    if case.when == "load":
        raises(lambda: tm.load(data), data, case.words, offset)
        raises(lambda: tm.load(bytearray(data)), data, case.words, offset)
        return

    lib = tm.load(data)  # lazily checked fields do not fail the load
    assert len(lib) == len(layout.functions)
    messages = set()
    if case.when == "use":
        bad = [name for name in lib.function_names if not _usable(lib, name)]
        assert len(bad) == 1, bad
        messages.add(raises(lambda: lib[bad[0]], data, case.words, offset))
        messages.add(raises(lib.to_bytes, data, case.words, offset))
    elif case.when == "bitcode":
        bad = [name for name in lib.function_names if not _bitcode_ok(lib[name])]
        assert len(bad) == 1, bad
        messages.add(raises(lambda: lib[bad[0]].bitcode, data, case.words, offset))
    elif case.when == "reflection":
        for name in lib.function_names:
            assert bytes(lib[name].bitcode[:4]) == b"BC\xc0\xde"
        messages.add(raises(lib.to_bytes, data, case.words, offset))
        messages.add(raises(lambda: lib.subset(lib.function_names), data, case.words, offset))
    else:
        assert case.when == "verify"
        for name in lib.function_names:
            assert bytes(lib[name].bitcode[:4]) == b"BC\xc0\xde"
    messages.add(raises(lib.verify, data, case.words, offset))
    messages.add(raises(lambda: tm.load(data, verify=True), data, case.words, offset))
    assert len(messages) == 1, messages  # every path reports the same field and offset


def _usable(lib, name) -> bool:
    try:
        lib[name]
    except tm.MetallibFormatError:
        return False
    return True


def _bitcode_ok(function) -> bool:
    try:
        function.bitcode
    except tm.MetallibFormatError:
        return False
    return True


def test_enough_distinct_malformations():
    assert len(CASES) >= 30


@pytest.mark.parametrize("length", range(1, HEADER_SIZE))
def test_truncated_header(length, fixture_metallib):
    data = fixture_metallib[:length]
    raises(lambda: tm.load(data), data, ("header", "88", f"got {length}"), 0)


def test_empty_and_truncated_files(tmp_path, fixture_metallib):
    empty = tmp_path / "empty.metallib"
    empty.write_bytes(b"")
    # Raised in Python before mapping (mmap cannot map an empty file); worded differently.
    raises(lambda: tm.load(empty), b"", ("header", "expected at least 88 bytes"), 0, strict_format=False)
    short = tmp_path / "short.metallib"
    short.write_bytes(fixture_metallib[:-1])
    raises(lambda: tm.load(str(short)), fixture_metallib[:-1], ("file size",), 16)


@pytest.mark.parametrize("source", ["fixture", "apple"])
def test_unknown_public_metadata_tag_is_kept(source, layouts):
    layout = layouts(source)
    target = layout.fn(1)  # a middle function, so later groups and sections move
    payload = b"\x01\x02\x03"
    data = splice(layout, target.public.endt, 0, tag_bytes(b"ZZZZ", payload))
    assert len(data) == len(layout.data) + 9
    lib = tm.load(data, verify=True)
    name = target.name.decode()
    assert lib.unknown_tags == [
        (f"function 1 '{name}' public metadata", "ZZZZ", target.public.endt, len(payload))
    ]
    assert lib.function_names == tuple(f.name.decode() for f in layout.functions)
    assert lib.to_bytes() == data
    assert bytes(lib[name].bitcode) == bytes(tm.load(layout.data)[name].bitcode)
    # A subset carries the unknown tag along with its function.
    kept = tm.load(lib.subset([name]))
    assert [tag[1] for tag in kept.unknown_tags] == ["ZZZZ"]


def test_layout_parser_round_trip(layouts):
    """The fix-ups the malformations rely on: a no-op splice changes nothing, an inserted
    tag gives a valid library, and removing it again gives back the original bytes."""
    layout = layouts("fixture")
    assert splice(layout, layout.fn(0).group.endt, 0, b"") == layout.data
    grown = Layout(splice(layout, layout.fn(2).group.endt, 0, tag_bytes(b"QQQQ", b"abc")))
    tm.load(grown.data, verify=True)
    assert remove_tag(grown, grown.fn(2).group.tag(b"QQQQ")) == layout.data


def test_non_utf8_names_are_readable(layouts):
    """Names in the file are bytes; what Python shows of them must not raise on bytes that
    are not UTF-8 (function names use surrogateescape; so must constant names and the
    places of unknown tags)."""
    layout = layouts("fixture")
    renamed = Layout(replace_payload(layout, layout.fn(0).group.tag(b"NAME"), b"\xff\xfek\0"))
    constants_tag = renamed.fn(0).public.tag(b"CNST")
    payload = renamed.data[constants_tag.payload_at : constants_tag.end]
    assert payload[2:3] == b"u"  # the first constant is 'use_bias'
    data = replace_payload(renamed, constants_tag, payload[:2] + b"\xff" + payload[3:])
    grown = Layout(data)
    data = splice(grown, grown.fn(0).public.endt, 0, tag_bytes(b"ZZZZ", b"1"))
    lib = tm.load(data, verify=True)
    name = "\udcff\udcfek"
    assert lib.function_names[0] == name
    assert [tag[1] for tag in lib.unknown_tags] == ["ZZZZ"]
    assert lib.unknown_tags[0][0] == f"function 0 '{name}' public metadata"
    assert [c.name for c in lib[name].declared_constants] == ["\udcffse_bias", "alpha"]
