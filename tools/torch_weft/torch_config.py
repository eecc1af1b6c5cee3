"""What meson needs to build torch_weft's extension against the torch of this
Python (meson's run_command, with -Dpython=true):

    python torch_config.py PYPROJECT

prints `key=value` lines: version, abi (_GLIBCXX_USE_CXX11_ABI), include
(torch's include directories, ';'-separated), libdir (torch's library
directories), and, where torch has CUDA and its headers and runtime are found
(as build.py looks for them), cuda_include and cudart. Fails, naming both
versions, when this torch is not the one pyproject.toml's dependencies pin:
the wheel says which torch it needs, and an extension built against another
would not load.
"""
import os
import re
import sys


def pinned_torch(pyproject):
    """The version in the `torch==X` of pyproject.toml's project.dependencies."""
    with open(pyproject) as f:
        deps = re.search(r"^dependencies\s*=\s*\[([^]]*)\]", f.read(), re.M)
    pins = re.findall(r'"torch\s*==\s*([^"\s;]+)"', deps.group(1) if deps else "")
    if len(pins) != 1:
        sys.exit(f"torch_config: the dependencies of {pyproject} must pin one torch "
                 f"(\"torch==X\"), found {pins}")
    return pins[0]


def cuda_paths(torch):
    """(include dir, libcudart path) of the CUDA runtime torch was built with, or None."""
    if torch.version.cuda is None:
        return None
    major = torch.version.cuda.split(".")[0]
    site = os.path.dirname(os.path.dirname(torch.__file__))
    roots = [os.path.join(site, "nvidia", f"cu{major}"), os.path.join(site, "nvidia", "cuda_runtime"),
             os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    for root in filter(None, roots):
        inc = os.path.join(root, "include")
        if not all(os.path.exists(os.path.join(inc, h))
                   for h in ("cuda_runtime_api.h", "crt/host_config.h")):
            continue
        for libdir in ("lib", "lib64"):
            d = os.path.join(root, libdir)
            libs = sorted(f for f in os.listdir(d) if f.startswith("libcudart.so")) \
                if os.path.isdir(d) else []
            if libs:
                return inc, os.path.join(d, libs[0])
    return None


def time_estimate_declared(include_paths):
    """Whether the c10d Backend of the torch whose headers are include_paths
    declares the virtuals startTimeEstimate/endTimeEstimate (torch 2.11 has
    neither); the extension overrides them only then (-DTORCH_WEFT_TIME_ESTIMATE,
    weft_backend.h). A comment naming them does not count."""
    for inc in include_paths:
        hpp = os.path.join(inc, "torch", "csrc", "distributed", "c10d", "Backend.hpp")
        if os.path.exists(hpp):
            with open(hpp, encoding="utf-8", errors="replace") as f:
                return re.search(r"virtual\s+void\s+startTimeEstimate\s*\(", f.read()) is not None
    return False


def main():
    pin = pinned_torch(sys.argv[1])
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as e:
        sys.exit(f"torch_config: torch=={pin} is needed to build torch_weft ({e}); "
                 f"install it into this Python ({sys.executable}), or build with pip's "
                 "build isolation, which installs it")
    version = torch.__version__.split("+")[0]
    if version != pin:
        sys.exit(f"torch_config: this Python has torch {torch.__version__}, but pyproject.toml "
                 f"pins torch=={pin}: the extension only loads into the torch it was built "
                 f"against. Build with torch {pin}, or change the pins in pyproject.toml (dependencies, build-system.requires) to "
                 f"\"torch=={version}\" to build for torch {version} (docs/pytorch.md)")
    print(f"version={version}")
    print(f"abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    print("include=" + ";".join(cpp_extension.include_paths()))
    print("libdir=" + ";".join(cpp_extension.library_paths()))
    print(f"time_estimate={int(time_estimate_declared(cpp_extension.include_paths()))}")
    cuda = cuda_paths(torch) if os.environ.get("TORCH_WEFT_CUDA", "1") != "0" else None
    if cuda:
        print(f"cuda_include={cuda[0]}")
        print(f"cudart={cuda[1]}")


if __name__ == "__main__":
    main()
