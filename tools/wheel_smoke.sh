#!/usr/bin/env bash
# Installs a torch_metallib wheel into a fresh venv that cannot see this checkout and runs
# tools/wheel_smoke_test.py there (load, reflect, call on the CPU, ops.define, the CLI).
#
#   bash tools/wheel_smoke.sh [WHEEL] [-- SMOKE_TEST_ARGS...]   # no WHEEL: tools/build_wheel.sh builds one
#
# The venv has no pip and no system site-packages: one .pth file puts the base
# interpreter's site-packages folder on its sys.path, so torch and llvmlite need not be
# reinstalled, while the .pth files in that folder (an editable install of this checkout
# among them) are not run. The test runs from a temporary folder with PYTHONPATH unset and
# its own kernel cache, and checks that torch_metallib and its _C come from the venv.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wheel=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then wheel=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); shift; fi
[ "${1:-}" = "--" ] && shift
[ -n "$wheel" ] || wheel=$(bash "$root/tools/build_wheel.sh" | tail -n 1)
work=$(mktemp -d "${TMPDIR:-/tmp}/torch_metallib_smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT
python -m venv --without-pip "$work/venv"
venv_site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python -c 'import sysconfig; p = sysconfig.get_paths(); print("\n".join(dict.fromkeys([p["purelib"], p["platlib"]])))' \
  > "$venv_site/_base_site_packages.pth"
python -m pip --python "$work/venv/bin/python" install --quiet --no-deps --no-index "$wheel"
cp "$root/tools/wheel_smoke_test.py" "$work/"
cd "$work"
env -u PYTHONPATH PYTHONNOUSERSITE=1 TORCH_METALLIB_CACHE_DIR="$work/cache" PATH="$work/venv/bin:$PATH" \
  "$work/venv/bin/python" wheel_smoke_test.py --source-root "$root" --fixtures "$root/tests/fixtures" "$@"
