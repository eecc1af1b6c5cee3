"""tools/torch_weft/torch_config.py's reading of torch's c10d Backend.hpp
(which build.py and the wheel's meson build both take): the
time-estimate virtuals are overridden only where that torch declares them
(torch 2.11 declares neither), whatever its comments say.

    python3 check_torch_build_flags.py REPO
"""
import os
import sys
import tempfile

repo = sys.argv[1]
sys.dont_write_bytecode = True  # the source tree stays as it is
sys.path.insert(0, os.path.join(repo, "tools", "torch_weft"))
import torch_config  # noqa: E402  (no torch needed: it imports torch in main())

DECLARED = """class Backend {
  // startTimeEstimate() and endTimeEstimate() bracket an estimate
  virtual bool supportsTimeEstimation() const { return false; }
  virtual void startTimeEstimate() {}
  virtual float endTimeEstimate() { return 0; }
};
"""
# 2.11's shape: no such virtuals; a comment naming them must not count
ABSENT = """class Backend {
  // a later torch adds startTimeEstimate() here
  virtual bool supportsTimeEstimation() const { return false; }
};
"""

failed = 0


def expect(name, text, want):
    global failed
    with tempfile.TemporaryDirectory() as root:
        other = os.path.join(root, "first")  # a path without the header comes first
        inc = os.path.join(root, "include")
        os.makedirs(other)
        if text is not None:
            d = os.path.join(inc, "torch", "csrc", "distributed", "c10d")
            os.makedirs(d)
            with open(os.path.join(d, "Backend.hpp"), "w", encoding="utf-8") as f:
                f.write(text)
        got = ["-DTORCH_WEFT_TIME_ESTIMATE"] if torch_config.time_estimate_declared([other, inc]) else []
    ok = got == want
    failed += not ok
    print(f"{'ok' if ok else 'FAIL'}: {name}: {got}" + ("" if ok else f", want {want}"))


expect("virtuals declared", DECLARED, ["-DTORCH_WEFT_TIME_ESTIMATE"])
expect("virtuals absent, named in a comment", ABSENT, [])
expect("no Backend.hpp", None, [])
sys.exit(1 if failed else 0)
