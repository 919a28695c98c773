"""Function constants in the shapes Apple's toolchains give them, run on the CPU.

``c = a * foo + b + bar`` (float constants) and ``c = (a * foo + b + bar)`` negated when
``negate`` (int and bool constants), written as AIR modules:

* the AIR 2.5-2.8 shape (MFA, mlx, tests/fixtures/function_constant_scale.ll): each
  ``MTL_FC_INIT`` placeholder copied by an ``air.static_init`` constructor into the
  internal global the kernel reads;
* the same with ``linkonce_odr hidden`` placeholders, as public AIR dumps show them
  (a frontend's output; a module whose constants no kernel reads);
* the kernel reading the placeholder itself, under an AIR 2.3 triple and version;
* an internal global nothing stores: refused, never computed with.
"""

import llvmlite.binding as llvm
import pytest
import torch

import torch_metallib as tm

_DATALAYOUT = ("e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-f32:32:32-f64:64:64-v16:16:16-"
               "v24:32:32-v32:32:32-v48:64:64-v64:64:64-v96:128:128-v128:128:128-v192:256:256-v256:256:256-"
               "v512:512:512-v1024:1024:1024-n8:16:32")
# (triple, !air.version, !air.language_version) of a macOS 11 and a macOS 14 toolchain
_AIR_23 = ("air64-apple-macosx11.0.0", "i32 2, i32 3, i32 0", '!"Metal", i32 2, i32 3, i32 0')
_AIR_26 = ("air64_v26-apple-macosx14.0.0", "i32 2, i32 6, i32 0", '!"Metal", i32 3, i32 1, i32 0')

# name -> (LLVM type, typecode, Metal type, index)
_FLOAT_CONSTANTS = {"foo": ("float", "f", "float", 0), "bar": ("float", "f", "float", 1)}
_INT_CONSTANTS = {"foo": ("i32", "i", "int", 0), "bar": ("i32", "i", "int", 1), "negate": ("i8", "b", "bool", 2)}


def _mangled(name: str) -> str:
    return f"{len(name)}{name}"


def _module(kernel: str, constants: dict, element: str, read: str, linkage: str = "internal unnamed_addr",
            air=_AIR_26, stores: bool = True, tested: bool = False) -> str:
    """The kernel `kernel` over buffers a, b, c of `element`. `read`: "copy" (the kernel reads
    @_ZL<name>, which a constructor fills from the placeholder unless not `stores`) or
    "placeholder" (the kernel reads the placeholder); `linkage`: the placeholders'. `tested`:
    foo reads as 9 where air.is_function_constant_defined says its placeholder is not set."""
    triple, version, language = air
    lines, ctor = [], []
    for name, (ir_type, code, _, index) in constants.items():
        placeholder = f"@_Z{_mangled(name)}.MTL_FC_INIT_{index}_{code}"
        lines.append(f'{placeholder} = {linkage} addrspace(2) externally_initialized constant {ir_type} undef, '
                     f'section "air.fc_initializer", align 4')
        if read == "copy":
            lines.append(f"@_ZL{_mangled(name)} = internal unnamed_addr addrspace(2) global {ir_type} undef, align 4")
            if stores:
                ctor += [f"%{name} = load {ir_type}, ptr addrspace(2) {placeholder}, align 4",
                         f"store {ir_type} %{name}, ptr addrspace(2) @_ZL{_mangled(name)}, align 4"]
    def source(name):
        return f"@_ZL{_mangled(name)}" if read == "copy" else f"@_Z{_mangled(name)}.MTL_FC_INIT_{constants[name][3]}_{constants[name][1]}"
    float_ops = element == "float"
    mul, add = ("fmul", "fadd") if float_ops else ("mul", "add")
    body = ["%i = zext i32 %gid to i64"]
    for buffer in ("a", "b"):
        body += [f"%p{buffer} = getelementptr {element}, ptr addrspace(1) %{buffer}, i64 %i",
                 f"%v{buffer} = load {element}, ptr addrspace(1) %p{buffer}, align 4"]
    foo = "%foo.set" if tested else "%foo"
    body += [f"{foo} = load {element}, ptr addrspace(2) {source('foo')}, align 4"]
    if tested:
        placeholder = f"@_Z{_mangled('foo')}.MTL_FC_INIT_0_{constants['foo'][1]}"
        fallback = "9.0" if float_ops else "9"
        body += [f"%foo.defined = call i1 @air.is_function_constant_defined(ptr addrspace(2) {placeholder})",
                 f"%foo = select i1 %foo.defined, {element} %foo.set, {element} {fallback}"]
    body += [f"%bar = load {element}, ptr addrspace(2) {source('bar')}, align 4",
             f"%af = {mul} {element} %va, %foo", f"%s = {add} {element} %af, %vb", f"%r = {add} {element} %s, %bar"]
    result = "%r"
    if "negate" in constants:
        body += [f"%negate = load i8, ptr addrspace(2) {source('negate')}, align 1, !range !30",
                 "%flag = icmp ne i8 %negate, 0", "%minus = sub i32 0, %r",
                 "%out = select i1 %flag, i32 %minus, i32 %r"]
        result = "%out"
    body += [f"%pc = getelementptr {element}, ptr addrspace(1) %c, i64 %i",
             f"store {element} {result}, ptr addrspace(1) %pc, align 4"]
    if ctor:
        lines.append("@llvm.global_ctors = appending global [1 x { i32, ptr, ptr }] "
                     "[{ i32, ptr, ptr } { i32 65535, ptr @_GLOBAL__sub_I_k.metal, ptr null }]")
    text = f'source_filename = "{kernel}"\ntarget datalayout = "{_DATALAYOUT}"\ntarget triple = "{triple}"\n\n'
    text += "\n".join(lines) + "\n\n"
    if tested:
        text += "declare i1 @air.is_function_constant_defined(ptr addrspace(2))\n\n"
    if ctor:
        text += ('define internal void @_GLOBAL__sub_I_k.metal() section "air.static_init" {\n  '
                 + "\n  ".join(ctor) + "\n  ret void\n}\n\n")
    buffers = ", ".join(f'ptr addrspace(1) noundef "air-buffer-no-alias" %{b}' for b in "abc")
    text += (f"define void @{kernel}({buffers}, i32 noundef %gid) local_unnamed_addr {{\n  "
             + "\n  ".join(body) + "\n  ret void\n}\n\n")
    metal = "float" if float_ops else "int"
    nodes = [f'!{4 + n} = !{{i32 {n}, !"air.buffer", !"air.location_index", i32 {n}, i32 1, '
             f'!"{"air.read_write" if b == "c" else "air.read"}", !"air.address_space", i32 1, '
             f'!"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, !"air.arg_type_name", '
             f'!"{metal}", !"air.arg_name", !"{b}"}}' for n, b in enumerate("abc")]
    nodes.append('!7 = !{i32 3, !"air.thread_position_in_grid", !"air.arg_type_name", !"uint", !"air.arg_name", !"gid"}')
    refs = []
    for n, (name, (ir_type, code, metal_type, index)) in enumerate(constants.items()):
        refs.append(f"!{10 + n}")
        nodes.append(f'!{10 + n} = !{{ptr addrspace(2) @_Z{_mangled(name)}.MTL_FC_INIT_{index}_{code}, '
                     f'!"{metal_type}", !"{name}", i32 {index}, i1 true}}')
    text += ("!air.version = !{!0}\n!air.language_version = !{!1}\n!air.kernel = !{!2}\n"
             f"!air.function_constants = !{{{', '.join(refs)}}}\n\n"
             f"!0 = !{{{version}}}\n!1 = !{{{language}}}\n!2 = !{{ptr @{kernel}, !3, !9}}\n!3 = !{{}}\n"
             "!9 = !{!4, !5, !6, !7}\n!30 = !{i8 0, i8 2}\n" + "\n".join(nodes) + "\n")
    return text


def _kernel(kernel: str, text: str):
    module = llvm.parse_assembly(text, context=llvm.create_context())
    module.verify()
    return tm.load(tm.pack([tm.FunctionSource(kernel, module.as_bitcode())]))[kernel]


def _run_float(function, foo: float, bar: float):
    a = torch.linspace(-3, 5, 67, dtype=torch.float32)
    b = torch.linspace(7, -2, 67, dtype=torch.float32)
    c = torch.full_like(a, float("nan"))
    function(a, b, c, threads=67, group_size=32, constants={"foo": foo, "bar": bar})
    torch.testing.assert_close(c, a * foo + b + bar, rtol=0, atol=0)


def _run_int(function, foo: int, bar: int, negate: bool):
    a = torch.arange(-20, 45, dtype=torch.int32)
    b = torch.arange(65, dtype=torch.int32) * 7 - 100
    c = torch.full_like(a, -12345)
    function(a, b, c, threads=65, group_size=32,
             constants={"foo": foo, "bar": bar, "negate": negate})
    expected = a * foo + b + bar
    assert torch.equal(c, -expected if negate else expected)


_SHAPES = {  # id -> _module keywords
    "air26_static_init": dict(read="copy"),
    "linkonce_odr_placeholder": dict(read="copy", linkage="linkonce_odr hidden"),
    "linkonce_odr_local_unnamed_placeholder": dict(read="copy", linkage="linkonce_odr hidden local_unnamed_addr"),
    "air23_reads_placeholder": dict(read="placeholder", air=_AIR_23),
    "air23_static_init": dict(read="copy", air=_AIR_23, linkage="linkonce_odr hidden"),
    "linkonce_odr_tested_placeholder": dict(read="placeholder", linkage="linkonce_odr hidden", tested=True),
}


@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_float_constants(shape):
    function = _kernel(f"fc_float_{shape}", _module(f"fc_float_{shape}", _FLOAT_CONSTANTS, "float", **_SHAPES[shape]))
    _run_float(function, 2.5, -0.75)
    _run_float(function, -1.25, 3.0)  # a second specialization of the same kernel


@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_int_and_bool_constants(shape):
    function = _kernel(f"fc_int_{shape}", _module(f"fc_int_{shape}", _INT_CONSTANTS, "i32", **_SHAPES[shape]))
    _run_int(function, 3, -11, False)
    _run_int(function, -7, 1000, True)


@pytest.mark.parametrize("air", [_AIR_23, _AIR_26], ids=["air23", "air26"])
def test_global_nothing_stores_is_refused(air):
    """The kernel reads @_ZL3foo and @_ZL3bar, which no constructor fills: their values are
    undefined, so the kernel is refused before it runs, naming them."""
    kernel = f"fc_unset_{air[1][4]}{air[1][11]}"
    function = _kernel(kernel, _module(kernel, _FLOAT_CONSTANTS, "float", read="copy", air=air, stores=False))
    a = torch.ones(8)
    c = torch.zeros(8)
    refusal = (rf"{kernel}: reads the constant-address-space global @_ZL3bar, @_ZL3foo, which nothing initializes; "
               r"expected .*, got float undef, float undef and no store\. ")
    with pytest.raises(tm.UnsupportedKernelError, match=refusal):
        function(a, a.clone(), c, threads=8, constants={"foo": 1.0, "bar": 2.0})
    assert torch.equal(c, torch.zeros(8))


def test_unspecialized_placeholder_is_refused():
    """A placeholder specialization does not recognise (here a vector) keeps undef: a kernel
    reading it is refused, naming it."""
    from torch_metallib.air.constant_globals import check_constant_globals
    from torch_metallib.air.function_constants import specialize_constants, take_constructors
    placeholder = "_Z5shape.MTL_FC_INIT_0_Dv4_j"
    text = (f'@{placeholder} = internal addrspace(2) externally_initialized constant <4 x i32> undef, '
            f'section "air.fc_initializer", align 16\n\n'
            f"define void @k(ptr addrspace(1) %out) {{\n"
            f"  %v = load <4 x i32>, ptr addrspace(2) @{placeholder}, align 16\n"
            f"  store <4 x i32> %v, ptr addrspace(1) %out, align 16\n  ret void\n}}\n")
    text, constructors = take_constructors(specialize_constants(text, {0: 1}))
    with pytest.raises(tm.UnsupportedKernelError, match=rf"k: reads the function-constant placeholder @{placeholder}, "
                                                         r".*; expected .*, got <4 x i32> undef\. "):
        check_constant_globals(text, "k", constructors)
