"""csrc/mps uses Apple's Metal and Foundation API, with Apple's types, by PyObjC's record of
Apple's SDK (tools/check_metal_api.py, docs/metal_api.md); and the check fails when a
selector is renamed, a type changed or an enum value moved. Linux only: it compiles
csrc/mps as tests/metal_sim does. PyObjC's files are fetched once into the corpus cache;
when they cannot be fetched the test fails (it never skips)."""

import pathlib
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import check_metal_api  # noqa: E402
from metal_api import encodings, pyobjc, uses  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="compiles csrc/mps against the simulated Metal "
                                                                  "(Linux); a Mac builds it against Apple's headers")
CSRC = ROOT / "torch_metallib" / "csrc" / "mps"


@pytest.fixture(scope="module")
def record():
    return pyobjc.load()  # RuntimeError (a failure) when the pinned wheels cannot be fetched


@pytest.fixture(scope="module")
def report(record):
    return check_metal_api.check(record=record)


def _checks(report):
    return {check.method: check for check in report.checks}


@pytest.mark.slow
def test_csrc_mps_uses_apples_api(report):
    assert report.findings == []
    checks = _checks(report)
    assert report.counts["methods used"] >= 24 and report.counts["exact (protocol tables)"] >= 12
    # An encoder method, exactly as Apple's SDK declares it (PyObjC's MTLComputeCommandEncoder table).
    add = checks["-[<MTLComputeCommandEncoder> setBuffer:offset:atIndex:]"]
    assert (add.ours, add.apple, add.source) == ("v@:@QQ", "v@:@QQ", "protocol table")
    assert checks["-[<MTLComputeCommandEncoder> setBytes:length:atIndex:]"].apple == "v@:r^vQQ"  # const void*
    # Property syntax (buffer.gpuAddress, device.maxThreadgroupMemoryLength) is seen as the getter it sends.
    assert any(where.startswith("command_encoder.mm") for where in checks["-[<MTLBuffer> gpuAddress]"].used_at)
    assert checks["-[<MTLDevice> maxThreadgroupMemoryLength]"].source == "metadata"
    # What PyObjC does not record is listed with a reason, and only that.
    unrecorded = {c.method for c in report.checks if c.source == "unrecorded"}
    assert unrecorded == set(check_metal_api.compare.UNRECORDED)
    # NSString, NSError, NSURL, NSArray, MTLFunctionConstantValues and, for binary archives,
    # MTLBinaryArchiveDescriptor, MTLComputePipelineDescriptor, MTLComputePipelineReflection.
    assert report.counts["classes"] == 8
    # The binary archive's methods exactly (PyObjC's MTLBinaryArchive table: BOOL return).
    for selector in ("addComputePipelineFunctionsWithDescriptor:error:", "serializeToURL:error:"):
        assert checks[f"-[<MTLBinaryArchive> {selector}]"].apple == "c@:@^@"
        assert checks[f"-[<MTLBinaryArchive> {selector}]"].source == "protocol table"
    made = checks["-[<MTLDevice> newComputePipelineStateWithDescriptor:options:reflection:error:]"]
    assert (made.ours, made.apple) == ("@@:@Q^@^@", "@@:@Q^@^@")


def test_every_file_is_inside_the_namespace_the_ast_is_read_for():
    for source in sorted(CSRC.glob("*.mm")):
        outside = [line for line in uses.outside_namespace(source.read_text())
                   if not check_metal_api._allowed_outside(line)]
        assert outside == [], source.name
    assert uses.outside_namespace("namespace torch_metallib::mps {\nvoid f() { g(); }\n}\nstatic void h() {}\n") \
        == ["static void h()"]


def _copy(path: pathlib.Path, folder: pathlib.Path, old: str, new: str) -> pathlib.Path:
    text = path.read_text()
    assert old in text, (path, old)
    target = folder / path.name
    target.write_text(text.replace(old, new))
    return target


@pytest.fixture
def headers(tmp_path):
    """A copy of the simulated headers to change."""
    return pathlib.Path(shutil.copytree(ROOT / "tests" / "metal_sim" / "include", tmp_path / "include"))


@pytest.mark.slow
def test_a_misspelled_selector_fails(tmp_path, record):
    misspelled = _copy(CSRC / "command_encoder.mm", tmp_path, "offset:0 atIndex:", "offset:0 atIndx:")
    report = check_metal_api.check([misspelled], record=record)
    assert any("command_encoder.mm:" in f and "setBuffer:offset:atIndx:] is declared nowhere" in f
               for f in report.findings), report.findings


@pytest.mark.slow
@pytest.mark.parametrize("source, old, new, expected", [
    # In a protocol PyObjC's binary holds: Apple's MTLComputeCommandEncoder has no such method.
    ("command_encoder.mm", "setThreadgroupMemoryLength:", "setThreadGroupMemoryLength:",
     "-[<MTLComputeCommandEncoder> setThreadGroupMemoryLength:atIndex:]: Apple's MTLComputeCommandEncoder has no"),
    # In one only PyObjC's metadata records: no method of that name in Apple's API.
    ("metal_library.mm", "newLibraryWithData:", "newLibraryFromData:",
     "-[<MTLDevice> newLibraryFromData:error:]: not in PyObjC's protocol tables or metadata"),
])
def test_a_selector_renamed_in_code_and_simulated_headers_fails(tmp_path, headers, record, source, old, new,
                                                               expected):
    """The simulated Metal builds and runs with the new name (both sides agree); only
    Apple's record tells that the Mac build would not."""
    _copy(headers / "Metal" / "Metal.h", headers / "Metal", old, new)
    renamed = _copy(CSRC / source, tmp_path, old, new)
    report = check_metal_api.check([renamed], include=headers, record=record)
    assert any(f.startswith(expected) for f in report.findings), report.findings


@pytest.mark.parametrize("old, new, expected", [
    ("offset:(NSUInteger)offset atIndex", "offset:(uint32_t)offset atIndex",
     "-[<MTLComputeCommandEncoder> setBuffer:offset:atIndex:]: ours v@:@IQ, Apple's v@:@QQ"),
    ("setBytes:(const void*)bytes", "setBytes:(void*)bytes",
     "-[<MTLComputeCommandEncoder> setBytes:length:atIndex:]: ours v@:^vQQ, Apple's v@:r^vQQ"),
    ("readonly) NSUInteger maxThreadgroupMemoryLength", "readonly) uint32_t maxThreadgroupMemoryLength",
     "-[<MTLDevice> maxThreadgroupMemoryLength]: return type: ours I, Apple's Q"),
    ("MTLDataTypeFloat = 3,", "MTLDataTypeFloat = 4,", "enum MTLDataTypeFloat is 4 here, 3 in Apple's Metal"),
    ("MTLFunctionConstantValues", "MTLFunctionConstants", "class MTLFunctionConstants is not in PyObjC's metadata"),
    ("NSUInteger width, height, depth;", "NSUInteger width, depth, height;", "struct MTLSize: ours {?=QQQ} "
     "['width', 'depth', 'height'], Apple's {MTLSize=QQQ} ['width', 'height', 'depth']"),
])
def test_a_wrong_type_or_value_in_the_simulated_headers_fails(headers, record, old, new, expected):
    _copy(headers / "Metal" / "Metal.h", headers / "Metal", old, new)
    report = check_metal_api.check([], include=headers, record=record)  # Metal.h's declarations alone
    assert any(f.startswith(expected) for f in report.findings), report.findings


def test_pyobjc_record(record):
    folder = pyobjc.fetch()
    licence = next(folder.rglob("LICENSE.txt")).read_text()
    assert "MIT license" in licence and "Ronald Oussoren" in licence
    expected = {"MTLComputeCommandEncoder", "MTLComputePipelineState", "MTLCommandQueue", "NSObject"}
    assert expected <= set(record.protocols)
    assert record.protocols["MTLComputeCommandEncoder"].parents == ["MTLCommandEncoder"]
    assert record.protocol_method("newLibraryWithData:error:")["arguments"][3] == {"type": "^@", "type_modifier": "o"}
    assert record.enums["MTLDataTypeBFloat"] == 121 and record.structs["MTLSize"][1] == ["width", "height", "depth"]


@pytest.mark.parametrize("spelling, expected", [
    ("NSUInteger", "Q"), ("const void *", "r^v"), ("NSError **", "^@"), ("id<MTLBuffer>", "@"),
    ("NSString *", "@"), ("const char *", "r*"), ("MTLSize", "{?=QQQ}"), ("MTLDataType", "Q"),
    ("dispatch_data_t", "@"), ("BOOL", "c"), ("SEL", ":"), ("MTLCommandBufferHandler", "@?"), ("uint64_t", "Q"),
])
def test_encodings_of_the_simulated_types(declared, spelling, expected):
    assert encodings.encode(spelling, declared) == expected


@pytest.fixture(scope="module")
def declared():
    build = check_metal_api._build_module()
    return check_metal_api.declarations.read_declarations(
        check_metal_api.INCLUDE, build.CLANG, build._objc_flags(pathlib.Path("x.mm")))
