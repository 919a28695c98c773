"""Code <-> name tables for the numeric fields of a .metallib (docs/formats.md, container)."""

# TYPE tag of a function.
FUNCTION_TYPES = {
    0: "vertex",
    1: "fragment",
    2: "kernel",
    3: "unqualified",
    4: "visible",
    5: "extern",
    6: "intersection",
    255: "none",
}

# Header byte 10, low 7 bits; bit 7 marks a stub.
FILE_TYPES = {0: "executable", 1: "coreimage", 2: "dynamic", 3: "symbol_companion"}
FILE_TYPE_STUB_BIT = 0x80

# Header byte 11, low 7 bits: the Mach-O platform id; bit 7 marks a 64-bit target.
PLATFORMS = {
    0: "unknown",
    1: "macos",
    2: "ios",
    3: "tvos",
    4: "watchos",
    5: "bridgeos",
    6: "maccatalyst",
    7: "ios_simulator",
    8: "tvos_simulator",
    9: "watchos_simulator",
    10: "driverkit",
    11: "visionos",
    12: "visionos_simulator",
}
PLATFORM_64BIT_BIT = 0x80

# MTLDataType, as used by function constants (values from Apple's MTLDataType.hpp).
DATA_TYPES = {
    1: "struct", 2: "array",
    3: "float", 4: "float2", 5: "float3", 6: "float4",
    7: "float2x2", 8: "float2x3", 9: "float2x4", 10: "float3x2", 11: "float3x3",
    12: "float3x4", 13: "float4x2", 14: "float4x3", 15: "float4x4",
    16: "half", 17: "half2", 18: "half3", 19: "half4",
    20: "half2x2", 21: "half2x3", 22: "half2x4", 23: "half3x2", 24: "half3x3",
    25: "half3x4", 26: "half4x2", 27: "half4x3", 28: "half4x4",
    29: "int", 30: "int2", 31: "int3", 32: "int4",
    33: "uint", 34: "uint2", 35: "uint3", 36: "uint4",
    37: "short", 38: "short2", 39: "short3", 40: "short4",
    41: "ushort", 42: "ushort2", 43: "ushort3", 44: "ushort4",
    45: "char", 46: "char2", 47: "char3", 48: "char4",
    49: "uchar", 50: "uchar2", 51: "uchar3", 52: "uchar4",
    53: "bool", 54: "bool2", 55: "bool3", 56: "bool4",
    58: "texture", 59: "sampler", 60: "pointer",
    81: "long", 82: "long2", 83: "long3", 84: "long4",
    85: "ulong", 86: "ulong2", 87: "ulong3", 88: "ulong4",
    121: "bfloat", 122: "bfloat2", 123: "bfloat3", 124: "bfloat4",
}


def name_of(table: dict, code: int) -> str:
    """The table's name for `code`, or ``"unknown(<code>)"`` for a value it lacks."""
    return table.get(code, f"unknown({code})")


def code_of(table: dict, name: str, what: str) -> int:
    """The code for `name`; ValueError listing the valid names otherwise."""
    for code, known in table.items():
        if known == name:
            return code
    raise ValueError(f"unknown {what} {name!r}; expected one of: {', '.join(sorted(table.values()))}")
