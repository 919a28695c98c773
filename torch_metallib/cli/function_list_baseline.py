"""The baseline `bench` measures loading against: a plain pure-Python reading of a
.metallib's function list, what a user could write in an afternoon.

It reads the header and walks every function-list group into a dict of name -> fields,
checking nothing and skipping the metadata sections, so it does less work than
``torch_metallib.load``; a speed-up against it is conservative. Imports nothing from
torch_metallib (the bench probe runs it in a fresh process without importing the package).
"""

import struct

__all__ = ["parse_function_list"]

# Magic, format version (3 x u16), file type, platform, platform version (u16, u8, u8),
# file size, then (offset, size) of the function list, public metadata, private metadata
# and modules: 88 bytes.
HEADER = struct.Struct("<4sHHHBBHBB9Q")
TAG = struct.Struct("<4sH")  # tag code and u16 payload length
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
OFFSETS = struct.Struct("<3Q")
VERSIONS = struct.Struct("<4H")


def parse_function_list(data) -> dict:
    """Name -> {type, hash, offsets, module_size, versions} for every function in `data`."""
    header = HEADER.unpack_from(data, 0)
    magic, list_offset = header[0], header[10]
    if magic != b"MTLB":
        raise ValueError(f"not a .metallib: magic {magic!r}")
    (count,) = U32.unpack_from(data, list_offset)
    functions = {}
    group = list_offset + 4
    for _ in range(count):
        (group_size,) = U32.unpack_from(data, group)
        fields = {}
        at = group + 4
        # ENDT has no length; the two bytes read after it are ignored.
        code, length = TAG.unpack_from(data, at)
        while code != b"ENDT":
            payload = at + 6
            if code == b"NAME":
                name = bytes(data[payload : payload + length - 1]).decode()
            elif code == b"TYPE":
                fields["type"] = data[payload]
            elif code == b"HASH":
                fields["hash"] = bytes(data[payload : payload + 32])
            elif code == b"OFFT":
                fields["offsets"] = OFFSETS.unpack_from(data, payload)
            elif code == b"MDSZ":
                fields["module_size"] = U64.unpack_from(data, payload)[0]
            elif code == b"VERS":
                fields["versions"] = VERSIONS.unpack_from(data, payload)
            at = payload + length
            code, length = TAG.unpack_from(data, at)
        functions[name] = fields
        group += group_size
    return functions
