#!/usr/bin/env bash
# The wheel as PyTorch users install it:
#
#   tests/tools/test_wheel.sh SOURCE_DIR
#
# clones SOURCE_DIR (its committed HEAD) into a temporary folder and builds
# the wheel there with pip and meson-python (-Dcuda=disabled, the small device
# matrix: quick, CPU tensors); installs it into a new venv that sees only the
# pinned torch and numpy (.venv-torch's, through a .pth file, so nothing is
# downloaded twice), renames the clone and makes it unreadable, then from
# another folder: a script that never imports torch_weft trains with DDP and
# FSDP2 on "weft" under torchrun (2 and 3 ranks) and matches Gloo;
# `python -m torch_weft` reports; LD_PRELOAD of the packaged libnccl.so.2 lets
# `import torch` run; a C program built against the packaged nccl.h runs an
# all-reduce on 2 ranks with the packaged weftrun and libnccl.so.2; the
# wheel's metadata pins exactly one torch, and a build against another torch
# fails naming both. Skips (77) without .venv-torch. Needs meson-python, meson
# and ninja from PyPI (pip install, or pip's cache). Prints "ok NAME" or
# "FAIL NAME" per check, the wheel's size and build time; exits non-zero when
# one failed.
set -u
src=$(cd "${1:?usage: test_wheel.sh SOURCE_DIR}" && pwd)
torch_python="$src/.venv-torch/bin/python"
if ! "$torch_python" -c "import torch, numpy" 2>/dev/null; then
  echo "SKIP: no $src/.venv-torch with torch and numpy (WEFT_SETUP_TORCH=1 tools/scripts/setup.sh makes it)"
  exit 77
fi
# the folders torch and numpy are installed in
torch_site=$("$torch_python" -c 'import os, numpy, torch
print("\n".join(sorted({os.path.dirname(os.path.dirname(m.__file__)) for m in (torch, numpy)})))')
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_wheel.XXXXXX") || exit 2
trap 'chmod -R u+rwx "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
nfailed=0
check() { # NAME STATUS [LOG]
  if [ "$2" -eq 0 ]; then echo "ok $1"; else
    echo "FAIL $1"
    [ -z "${3:-}" ] || tail -n 40 "$3" | sed 's/^/  | /'
    nfailed=$((nfailed + 1))
  fi
}
# a venv whose site-packages sees the folder of .venv-torch's torch and numpy
# (and pip): a plain path in a .pth file adds that folder, not the .pth files
# in it, so the checkout's torch_weft.pth there does not come along
venv_with_torch() {
  python3 -m venv --without-pip "$1" &&
    echo "$torch_site" >"$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch-site.pth"
}

git clone --quiet "$src" "$tmp/clone"
check "git clone" $?
# the build's Python: torch (pinned), meson-python, meson, ninja
venv_with_torch "$tmp/build-venv" &&
  "$tmp/build-venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    meson-python meson ninja >"$tmp/pip.log" 2>&1
check "build venv with meson-python" $? "$tmp/pip.log"
t0=$SECONDS
(cd "$tmp/clone" && "$tmp/build-venv/bin/python" -m pip wheel --no-build-isolation --no-deps \
  --disable-pip-version-check -w "$tmp/dist" -Csetup-args=-Dcuda=disabled \
  -Csetup-args=-Ddevice_matrix=small .) >"$tmp/wheel.log" 2>&1
check "pip wheel . in the clone" $? "$tmp/wheel.log"
wheel=$(ls "$tmp"/dist/torch_weft-*.whl 2>/dev/null)
[ -n "$wheel" ] || { echo "test_wheel: no wheel"; exit 1; }
echo "test_wheel: $(basename "$wheel"): $(($(stat -c %s "$wheel") / 1024)) KiB, built in $((SECONDS - t0)) s"

# metadata: exactly one torch, pinned to one version
python3 - "$wheel" >"$tmp/meta.log" 2>&1 <<'EOF'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
reqs = [l.split(":", 1)[1].strip() for l in meta.splitlines() if l.startswith("Requires-Dist:")]
torch = [r for r in reqs if re.match(r"torch\b", r)]
print("Requires-Dist:", reqs)
assert len(torch) == 1 and re.fullmatch(r"torch==\d+\.\d+\.\d+", torch[0]), torch
EOF
check "metadata pins exactly one torch ($(grep -o "torch==[0-9.]*" "$tmp/meta.log" | head -1))" $? "$tmp/meta.log"
# a build for another torch than the pin fails, naming both
sed 's/^dependencies = \["torch==[^"]*"\]/dependencies = ["torch==1.0.0"]/' "$tmp/clone/pyproject.toml" >"$tmp/other.toml"
! "$tmp/build-venv/bin/python" "$tmp/clone/tools/torch_weft/torch_config.py" "$tmp/other.toml" \
  >"$tmp/pin.log" 2>&1 && grep -q "torch==1.0.0" "$tmp/pin.log" && grep -q "has torch 2" "$tmp/pin.log"
check "a build against another torch fails, naming both" $? "$tmp/pin.log"

venv_with_torch "$tmp/venv" &&
  "$tmp/venv/bin/python" -m pip install --quiet --no-index --disable-pip-version-check "$wheel" \
    >"$tmp/install.log" 2>&1
check "pip install the wheel into a new venv" $? "$tmp/install.log"
# nothing of the clone may be needed from here on
mv "$tmp/clone" "$tmp/clone.gone" && chmod 000 "$tmp/clone.gone"
mkdir "$tmp/run" && cd "$tmp/run" || exit 2
py="$tmp/venv/bin/python"

"$py" -m torch_weft >info.log 2>&1 && grep -q "built for $("$py" -c 'import torch; print(torch.__version__.split("+")[0])')" info.log
check "python -m torch_weft" $? info.log
cat info.log
cp "$src/tests/torch/check_installed.py" .
for n in 2 3; do
  OMP_NUM_THREADS=1 timeout 300 "$py" -m torch.distributed.run --standalone --nproc-per-node $n \
    check_installed.py >train$n.log 2>&1 && grep -q "check_installed: $n ranks, ok" train$n.log
  check "DDP and FSDP2 on weft match Gloo, $n ranks, no import torch_weft" $? train$n.log
done
grep "rank 0: " train2.log

nccl=$("$py" -m torch_weft --nccl-path) && include=$("$py" -m torch_weft --include-dir)
check "python -m torch_weft --nccl-path, --include-dir" $?
LD_PRELOAD="$nccl" "$py" -c "import torch; print(torch.ones(4).sum().item())" >preload.log 2>&1
check "LD_PRELOAD=\$(python -m torch_weft --nccl-path) python -c 'import torch'" $? preload.log
cc -o install_nccl "$src/tests/tools/install_nccl.c" -I"$include" -L"$(dirname "$nccl")" -l:libnccl.so.2 \
  -Wl,-rpath,"$(dirname "$nccl")" >cc.log 2>&1 &&
  timeout 60 "$tmp/venv/bin/weftrun" -n 2 ./install_nccl >nccl.log 2>&1 &&
  [ "$(grep -c ': ok$' nccl.log)" -eq 2 ]
check "a program against the packaged nccl.h and libnccl.so.2, 2 ranks under the packaged weftrun" $? nccl.log

echo "test_wheel: $nfailed failed"
[ "$nfailed" -eq 0 ]
