"""Builds torch_weft's C++ extension (torch_weft/_C) against the installed
PyTorch and weft's shared library in a build directory.

    python tools/torch_weft/build.py [--weft-build build]

Every csrc/*.cpp compiled by g++ directly, one per core: torch's headers are heavy,
and the torch wheel's own compile flags are all it needs. The extension finds
libweft through an rpath to the build directory. Rebuilds only when the source,
libweft or torch changed.
"""
import argparse
import concurrent.futures
import os
import subprocess
import sys
import sysconfig

from torch_config import time_estimate_declared

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def cuda_flags(torch):
    """Compile and link flags for the CUDA part (csrc/weft_cuda.cpp), or []
    when the installed torch has no CUDA or TORCH_WEFT_CUDA=0. CUDA's headers
    and runtime come from the CUDA wheels torch installed (nvidia/cu*), else
    from CUDA_HOME or /usr/local/cuda."""
    if torch.version.cuda is None or os.environ.get("TORCH_WEFT_CUDA", "1") == "0":
        return []
    major = torch.version.cuda.split(".")[0]
    site = os.path.dirname(os.path.dirname(torch.__file__))
    roots = [os.path.join(site, "nvidia", f"cu{major}"), os.path.join(site, "nvidia", "cuda_runtime"),
             os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    for root in roots:
        inc = os.path.join(root, "include")
        # cuda_runtime.h includes crt/host_config.h, which some runtime
        # wheels lack (their headers come with the nvcc wheel): the whole set or the next root
        if not root or not all(os.path.exists(os.path.join(inc, h))
                               for h in ("cuda_runtime_api.h", "crt/host_config.h")):
            continue
        for libdir in ("lib", "lib64"):
            d = os.path.join(root, libdir)
            libs = sorted(f for f in os.listdir(d) if f.startswith("libcudart.so")) \
                if os.path.isdir(d) else []
            if libs:
                return ["-DTORCH_WEFT_CUDA", "-I" + inc, os.path.join(d, libs[0]),
                        "-Wl,-rpath," + d, "-lc10_cuda"]
    print(f"torch_weft: torch has CUDA {torch.version.cuda} but no CUDA headers and runtime "
          f"were found (looked in {', '.join(r for r in roots if r)}): CPU tensors only",
          flush=True)
    return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft-build", default=os.path.join(REPO, "build"),
                    help="meson build directory holding libweft.so")
    ap.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = ap.parse_args()

    import torch
    from torch.utils import cpp_extension

    weft_build = os.path.abspath(args.weft_build)
    libweft = os.path.join(weft_build, "libweft.so")
    if not os.path.exists(libweft):
        sys.exit(f"torch_weft: {libweft} not found: build weft first (ninja -C {weft_build})")
    csrc = os.path.join(HERE, "csrc")
    srcs = sorted(os.path.join(csrc, f) for f in os.listdir(csrc) if f.endswith(".cpp"))
    headers = sorted(os.path.join(csrc, f) for f in os.listdir(csrc) if f.endswith(".h"))
    out = os.path.join(HERE, "torch_weft", "_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    stamp = out + ".stamp"
    inputs = srcs + headers + [os.path.join(REPO, "include", "weft.h"), os.path.realpath(libweft)]
    cuda = cuda_flags(torch)
    key = f"{torch.__version__} {weft_build} cuda={bool(cuda)}"
    if (not args.force and os.path.exists(out) and os.path.exists(stamp)
            and open(stamp).read() == key
            and all(os.path.getmtime(p) <= os.path.getmtime(out) for p in inputs)):
        print(f"torch_weft: {os.path.relpath(out, REPO)} is up to date")
        return

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    compile_flags = ["g++", "-O2", "-g0", "-std=c++20", "-fPIC", "-w",
                     f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_EXTENSION_NAME=_C",
                     "-DTORCH_API_INCLUDE_EXTENSION_H",
                     "-I" + os.path.join(REPO, "include"),
                     "-I" + sysconfig.get_paths()["include"]]
    compile_flags += ["-I" + p for p in cpp_extension.include_paths()]
    compile_flags += [f for f in cuda if f.startswith(("-D", "-I"))]
    if time_estimate_declared(cpp_extension.include_paths()):
        compile_flags.append("-DTORCH_WEFT_TIME_ESTIMATE")
    objdir = out + ".objs"
    os.makedirs(objdir, exist_ok=True)
    objs = [os.path.join(objdir, os.path.basename(s) + ".o") for s in srcs]
    print("torch_weft: compiling", " ".join(os.path.relpath(s, REPO) for s in srcs), flush=True)
    # one compiler per core: each unit reads torch's heavy headers
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        runs = list(pool.map(lambda so: subprocess.run(compile_flags + ["-c", so[0], "-o", so[1]]),
                             zip(srcs, objs)))
    failed = [os.path.relpath(s, REPO) for s, r in zip(srcs, runs) if r.returncode != 0]
    if failed:
        sys.exit(f"torch_weft: compiling {', '.join(failed)} failed")
    cmd = ["g++", "-shared"] + objs + ["-o", out + ".tmp"]
    for p in cpp_extension.library_paths():
        cmd += ["-L" + p, "-Wl,-rpath," + p]
    cmd += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
            "-L" + weft_build, "-Wl,-rpath," + weft_build, "-lweft"]
    cmd += [f for f in cuda if not f.startswith(("-D", "-I"))]
    subprocess.run(cmd, check=True)
    os.replace(out + ".tmp", out)
    with open(stamp, "w") as f:
        f.write(key)
    print(f"torch_weft: built {os.path.relpath(out, REPO)}")


if __name__ == "__main__":
    main()
