"""The Objective-C protocol tables of a Mach-O binary (PyObjC's ``_Metal.so``), read in Python.

A binary compiled against Apple's SDK that names ``@protocol(P)`` carries P's definition for
the runtime: its parents, and every method with the type encoding clang computed from the
SDK's declaration (``v40@0:8@16Q24Q32`` for ``-(void)setBuffer:(id<MTLBuffer>)b
offset:(NSUInteger)o atIndex:(NSUInteger)i``). This reads the x86_64 slice of a universal
binary (its pointers are plain addresses; the arm64 slice's differ only in ``BOOL``, encoded
``B`` there and ``c`` here): ``__objc_protolist`` -> ``protocol_t`` -> ``method_list_t``.
"""

import struct
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

__all__ = ["Protocol", "protocols"]

_FAT_MAGIC, _MH_MAGIC_64 = 0xCAFEBABE, 0xFEEDFACF
_CPU_X86_64 = 0x01000007
_LC_SEGMENT_64, _LC_DYLD_CHAINED_FIXUPS = 0x19, 0x80000034


@dataclass
class Protocol:
    name: str
    parents: List[str]
    # (kind, selector) -> type encoding; kind "-" instance, "+" class; optional methods too
    methods: Dict[Tuple[str, str], str] = field(default_factory=dict)
    optional: set = field(default_factory=set)


def _slice(data: bytes) -> bytes:
    magic, count = struct.unpack_from(">II", data, 0)
    if magic != _FAT_MAGIC:
        return data
    for index in range(count):
        cputype, _, offset, size, _ = struct.unpack_from(">iiIII", data, 8 + 20 * index)
        if cputype == _CPU_X86_64:
            return data[offset:offset + size]
    raise ValueError("no x86_64 slice in this universal binary")


class _Image:
    def __init__(self, data: bytes):
        if struct.unpack_from("<I", data, 0)[0] != _MH_MAGIC_64:
            raise ValueError("not a 64-bit Mach-O image")
        self.data, self.segments, self.sections = data, [], {}
        commands, at = struct.unpack_from("<I", data, 16)[0], 32
        for _ in range(commands):
            command, size = struct.unpack_from("<II", data, at)
            if command == _LC_DYLD_CHAINED_FIXUPS:  # pointers would be encoded: not read here
                raise ValueError("chained fixups: this reader takes plain pointers only")
            if command == _LC_SEGMENT_64:
                vmaddr, _, fileoff, filesize = struct.unpack_from("<QQQQ", data, at + 24)
                self.segments.append((vmaddr, fileoff, filesize))
                for index in range(struct.unpack_from("<I", data, at + 64)[0]):
                    header = at + 72 + 80 * index
                    name = data[header:header + 16].rstrip(b"\0").decode()
                    self.sections[name] = struct.unpack_from("<QQ", data, header + 32)  # address, size
            at += size

    def offset(self, address: int) -> int:
        for vmaddr, fileoff, filesize in self.segments:
            if vmaddr <= address < vmaddr + filesize:
                return fileoff + address - vmaddr
        raise ValueError(f"address {address:#x} is in no segment")

    def pointer(self, address: int) -> int:
        return struct.unpack_from("<Q", self.data, self.offset(address))[0]

    def string(self, address: int) -> str:
        at = self.offset(address)
        return self.data[at:self.data.index(b"\0", at)].decode()

    def methods(self, address: int) -> List[Tuple[str, str]]:
        """(selector, encoding) of a pointer-based method_list_t (24-byte entries)."""
        if not address:
            return []
        flags, count = struct.unpack_from("<II", self.data, self.offset(address))
        if flags & 0xFFFF != 24:
            raise ValueError(f"method list at {address:#x}: entries of {flags & 0xFFFF} bytes, expected 24")
        return [(self.string(self.pointer(address + 8 + 24 * i)), self.string(self.pointer(address + 16 + 24 * i)))
                for i in range(count)]


def protocols(data: bytes) -> Dict[str, Protocol]:
    """name -> Protocol for every protocol the binary defines."""
    image = _Image(_slice(data))
    address, size = image.sections["__objc_protolist"]
    found = {}
    for index in range(size // 8):
        proto = image.pointer(address + 8 * index)
        # protocol_t: isa, name, protocols, instanceMethods, classMethods,
        # optionalInstanceMethods, optionalClassMethods, ...
        name = image.string(image.pointer(proto + 8))
        parents_at = image.pointer(proto + 16)
        parents = []
        if parents_at:
            count = image.pointer(parents_at)
            parents = [image.string(image.pointer(image.pointer(parents_at + 8 + 8 * i) + 8)) for i in range(count)]
        protocol = Protocol(name, parents)
        for slot, kind, optional in ((24, "-", False), (32, "+", False), (40, "-", True), (48, "+", True)):
            for selector, encoding in image.methods(image.pointer(proto + slot)):
                protocol.methods[(kind, selector)] = encoding
                if optional:
                    protocol.optional.add((kind, selector))
        found[name] = protocol
    return found
