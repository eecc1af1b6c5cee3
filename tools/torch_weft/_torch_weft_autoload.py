"""torch's device-backend autoload for torch_weft (entry point group
`torch.backends` of the installed package): `import torch` calls register(),
which registers the "weft" backend of torch.distributed, so that
`init_process_group("weft")` works without `import torch_weft`.

It registers and nothing more: torch's CPU allocator stays torch's. A program
that wants weft's (docs/pytorch.md) imports torch_weft itself, which runs the
package again and installs it, as it does without the entry point.
TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns the autoload off.
"""
import sys
import warnings

# true while register() imports the package: torch_weft/__init__.py then
# registers the backend without installing the allocator
registering = False


def register():
    global registering
    if "torch_weft" in sys.modules:  # the program's `import torch_weft` imports torch
        return
    registering = True
    try:
        import torch_weft  # noqa: F401  registers "weft"
    except ImportError as e:
        # built for another torch than this one: `import torch` still works,
        # and the warning says why "weft" is not there
        warnings.warn(f"the weft backend of torch.distributed is not registered: {e}", stacklevel=2)
        return
    finally:
        registering = False
    # The backend stays registered and the extension loaded (torch_weft._C);
    # forgetting the package makes the program's own `import torch_weft` run it
    # again, and that import installs the allocator.
    del sys.modules["torch_weft"]
