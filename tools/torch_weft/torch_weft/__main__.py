"""python -m torch_weft: what this installation of torch_weft is.

    python -m torch_weft                version, torch, CUDA tensors, libnccl.so.2, weftrun
    python -m torch_weft --nccl-path    the path of the packaged libnccl.so.2 only, for
                                        LD_PRELOAD=$(python -m torch_weft --nccl-path) python train.py
    python -m torch_weft --include-dir  the folder of weft.h and nccl.h
"""
import argparse
import os
import shutil
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(prog="python -m torch_weft", description=__doc__.split("\n")[0])
    ap.add_argument("--nccl-path", action="store_true", help="print the path of libnccl.so.2 only")
    ap.add_argument("--include-dir", action="store_true",
                    help="print the folder of weft.h and nccl.h only")
    args = ap.parse_args()
    nccl = os.path.join(HERE, "libnccl.so.2")
    include = os.path.join(HERE, "include")
    if args.nccl_path or args.include_dir:
        path = nccl if args.nccl_path else include
        if not os.path.exists(path):
            sys.exit(f"torch_weft: {path} is not there (this torch_weft is not an installed "
                     "wheel: pip install . builds one)")
        print(path)
        return

    import torch
    import torch_weft
    from torch_weft import _C

    v = torch_weft.version()
    print(f"torch_weft {v // 10000}.{v // 100 % 100}.{v % 100} in {HERE}")
    try:
        from torch_weft._build_info import TORCH_VERSION as built
    except ImportError:  # built in the tree by build.py, against this torch
        built = "this torch: an in-tree build"
    print(f"torch: {torch.__version__} (built for {built})")
    cuda = _C.cuda_built()
    print(f"CUDA tensors: {'yes' if cuda and torch.cuda.is_available() else 'no'} "
          f"(extension built {'with' if cuda else 'without'} CUDA, "
          f"{'a' if torch.cuda.is_available() else 'no'} GPU visible)")
    print(f"libnccl.so.2: {nccl if os.path.exists(nccl) else 'not packaged (an in-tree build)'}")
    # pip puts weftrun into the environment's scripts folder (bin/)
    weftrun = os.path.join(sysconfig.get_path("scripts"), "weftrun")
    print(f"weftrun: {weftrun if os.path.exists(weftrun) else shutil.which('weftrun') or 'not found'}")


if __name__ == "__main__":
    main()
