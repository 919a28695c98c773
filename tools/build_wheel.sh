#!/usr/bin/env bash
# Builds a torch_metallib wheel against the installed torch and prints its path.
#
#   bash tools/build_wheel.sh [OUTDIR]          # default dist/
#
# `python -m build --wheel --no-isolation`: the extension links torch's C++ ABI, so it is
# compiled against the torch of this environment, not a fresh one (docs/install.md). Its
# ninja build shares build/ with `python setup.py build_ext --inplace` (.ci/setup), so after
# that build nothing is recompiled: the wheel only relinks and packs (seconds).
# On Linux, `auditwheel repair` then gives the wheel a manylinux tag and strips the
# extension's symbols and debug information (61 MB -> 1 MB); torch's own libraries, and the
# OpenMP runtime torch ships and loads first, are left out: the extension uses the ones of
# the torch it is imported with. Needs `build` (and on Linux `auditwheel` and `patchelf`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
outdir=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
cd "$root"
mkdir -p build
raw="$root/build/wheel"
# build/lib.* is what bdist_wheel packs, and it is never cleaned: a module deleted from the
# tree would stay in the wheel. The objects (build/temp.*) are kept.
rm -rf "$raw" build/lib.* build/bdist.*
python -m build --wheel --no-isolation --outdir "$raw" . > build/wheel.log 2>&1 || { cat build/wheel.log; exit 1; }
wheel=$(ls "$raw"/torch_metallib-*.whl)
if [ "$(uname)" = Linux ]; then
  python -m auditwheel repair --strip --wheel-dir "$outdir" \
    --exclude libc10.so --exclude 'libtorch*.so' --exclude libgomp.so.1 "$wheel" > build/auditwheel.log 2>&1 \
    || { cat build/auditwheel.log; exit 1; }
  wheel="$outdir/$(sed -n 's|^Fixed-up wheel written to .*/||p' build/auditwheel.log)"
else
  cp "$wheel" "$outdir/"
  wheel="$outdir/$(basename "$wheel")"
fi
[ -f "$wheel" ] || { echo "build_wheel.sh: no wheel at $wheel" >&2; exit 1; }
echo "$wheel"
