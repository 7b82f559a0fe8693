"""Importing torchvision next to torch's CPU build.

torchvision 0.28.0 on PyPI is built against torch's CUDA build: its C++ ops library (_C.so) needs
libtorch_cuda.so and does not load next to the CPU build that scripts/setup installs. torchvision
then runs without its custom ops (torchvision/extension.py's _has_ops() is False), which the
classification models and transforms do not use, but two of its fake-kernel registrations are not
guarded by that check (torchvision 0.28.0, torchvision/_meta_registrations.py: register_fake on
"torchvision::nms" and "torchvision::qnms"), so `import torchvision` fails with "operator
torchvision::nms does not exist". Only when that happens, we declare the two operators' schemas (as
the C++ library would have) and import again; the detection ops then raise if called. With a CUDA
torch (the GPU image) the first import succeeds and nothing is declared.
"""

from __future__ import annotations

import sys

# nms as torchvision's C++ library declares it (torchvision/csrc/ops/nms.cpp, TORCH_LIBRARY_FRAGMENT);
# qnms takes the same arguments (its fake kernel in torchvision/_meta_registrations.py, meta_qnms).
_UNGUARDED_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library = None  # keeps the declarations alive


def import_torchvision():
    global _library
    try:
        import torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e) or _library is not None:
            raise
        import torch

        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        _library = torch.library.Library("torchvision", "DEF")
        for schema in _UNGUARDED_OPS:
            _library.define(schema)
        import torchvision
    return torchvision
