"""The doctor's human-readable report: a few lines per section, from doctor.report()'s data."""

from typing import List

__all__ = ["render", "human_bytes"]

# CPU features worth a glance (the JSON lists them all).
_NOTABLE = ("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bf16", "avx512fp16", "amx-tile", "neon",
            "fp-armv8", "fullfp16", "bf16", "sve", "sve2", "sme")


def human_bytes(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


def _folder(entry: dict) -> str:
    if not entry.get("exists"):
        return f"{entry.get('path')} (none)"
    return f"{entry['path']} ({human_bytes(entry['bytes'])}, {entry['files']} files)"


def _failed(section) -> str:
    return f"could not be read: {section['error']}" if isinstance(section, dict) and "error" in section else ""


def _versions(found: dict) -> List[str]:
    v = found["versions"]
    if _failed(v):
        return [f"Versions   {_failed(v)}"]
    lines = [f"Versions   torch_metallib {v['torch_metallib']}, torch {v['torch']}, llvmlite {v['llvmlite']} "
             f"(LLVM {v['llvm']}), {v['python_implementation']} {v['python']}",
             f"OS         {v['os']}" + (f" (macOS {v['macos']})" if v.get("macos") else "")]
    c = found["cpu"]
    if _failed(c):
        lines.append(f"CPU        {_failed(c)}")
    else:
        notable = [name for name in _NOTABLE if name in c["features"]]
        lines.append(f"CPU        {c['name']} ({c['triple']}), {len(c['features'])} features"
                     f"{': ' + ' '.join(notable) if notable else ''}; torch threads {c['torch_threads']}")
    g = found["cuda"]
    if _failed(g):
        lines.append(f"CUDA       {_failed(g)}")
    else:
        gpus = ", ".join(f"{d['name']} (sm_{d['capability'].replace('.', '')}, {human_bytes(d['memory_bytes'])})"
                         for d in g["devices"]) or "no GPU"
        lines.append(f"CUDA       torch CUDA {v.get('torch_cuda') or '- (CPU build)'}, driver {g['driver'] or '-'}, "
                     f"{gpus}")
    m = found["metal"]
    if _failed(m):
        lines.append(f"Metal      {_failed(m)}")
    else:
        device = m["chip"] or ("a Metal device" if m["available"] else "no Metal device")
        lines.append(f"Metal      {device}; torch MPS {'available' if m['available'] else 'not available'}, "
                     f"Metal backend {'built' if m['backend_built'] else 'not built'}")
    return lines


def _backends(found: dict) -> List[str]:
    b = found["backends"]
    if _failed(b):
        return [f"Backends   {_failed(b)}"]
    lines = []
    for name, state in b.items():
        head = "Backends   " if not lines else " " * 11
        verdict = "available" if state["available"] else "not available"
        why = f": {state['reason']}" if state.get("reason") else ""
        lines.append(f"{head}{name:<5} {verdict}{why}")
        lines += [" " * 17 + f"note: {note}" for note in state.get("notes", [])]
    return lines


def _caches(found: dict) -> List[str]:
    c = found["caches"]
    if _failed(c):
        return [f"Caches     {_failed(c)}"]
    disk = c["disk_cache"]
    if disk["enabled"]:
        kinds = ", ".join(f"{kind} {human_bytes(entry['bytes'])}" for kind, entry in disk["kinds"].items()
                          if entry["exists"]) or "empty"
        lines = [f"Caches     kernels {disk['root']} ({kinds})"]
    else:
        lines = ["Caches     kernels: off (TORCH_METALLIB_CACHE=0)"]
    lines.append(f"           corpus  {_folder(c['corpus'])}")
    lines.append(f"           public  {_folder(c['public_corpus'])}")
    if c["environment"]:
        lines.append("           set: " + ", ".join(f"{k}={v}" for k, v in c["environment"].items()))
    return lines


def _self_test(found: dict) -> List[str]:
    lines = []
    for result in found["self_test"]:
        head = "Self-test  " if not lines else " " * 11
        if result["passed"]:
            scheme = f", {result['cpu_scheme']}" if result.get("cpu_scheme") else ""
            outcome = (f"ok ({result['elements']} elements equal {result['compared_with']}, "
                       f"{result['seconds'] * 1000:.0f} ms{scheme})")
        elif result.get("error"):
            outcome = f"FAILED: {result['error']}"
        else:
            outcome = (f"FAILED: {result['mismatches']} of {result['elements']} elements differ from "
                       f"{result['compared_with']} (max abs error {result['max_abs_error']})")
        lines.append(f"{head}{result['backend']:<5} {result['check']:<12} {result.get('subject', ''):<40} {outcome}")
    if not lines:
        lines.append("Self-test  no backend to test")
    total, failed = len(found["self_test"]), sum(not result["passed"] for result in found["self_test"])
    lines.append(f"All {total} self-tests passed ({found['seconds']:.1f} s)." if total and not failed else
                 f"FAILED: {failed} of {total} self-tests ({found['seconds']:.1f} s); exit status 1.")
    return lines


def render(found: dict) -> str:
    return "\n".join(_versions(found) + _backends(found) + _caches(found) + _self_test(found))
