"""torchvision's model definitions, importable beside a CPU build of torch.

PyPI's torchvision wheels for Linux x86_64 are CUDA builds: next to a CPU build of torch their
compiled extension (``torchvision._C``: nms, roi_align, deform_conv2d, ...) cannot load, and
``import torchvision`` then stops at ``operator torchvision::nms does not exist`` (its import
registers fake kernels for ``nms`` and ``qnms`` unconditionally), and so does every
``transformers`` model class, since transformers imports torchvision whenever it is installed.
The classifiers the lab uses (ResNet, ViT, ConvNeXt, EfficientNet, Swin, MobileNet) are pure
Python and call none of those ops.

:func:`prepare_torchvision` runs before labkit imports transformers or torchvision: on a CPU build
of torch, when torchvision's extension is there but cannot be loaded, it declares the two op
schemas without any kernel, so that the import goes through. Those ops stay unusable (a call says
there is no kernel); the model definitions work. Where the extension loads (a GPU machine, a CPU
build of torchvision), nothing is declared.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys
from typing import Any

import torch

from labkit.core.errors import LabkitError

# torchvision (4.6 s to import: python -X importtime, 2-core machine) is imported where a model is built.

# the ops torchvision's import registers fake kernels for without checking that its extension loaded
_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_declared: list[Any] = []   # keeps the torch.library.Library alive (its definitions go with it)


def _declare_missing_ops() -> None:
    if _declared:
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        name = schema.split("(", 1)[0]
        if not hasattr(torch.ops.torchvision, name):
            lib.define(schema)
    _declared.append(lib)


def prepare_torchvision() -> None:
    """Make ``import torchvision`` work beside a CPU torch when its compiled extension cannot load
    (see the module doc); a no-op where torchvision is absent, already imported, or loads its ops."""
    if _declared or "torchvision" in sys.modules or torch.version.cuda is not None:
        return
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    libs = [p for loc in spec.submodule_search_locations for p in glob.glob(os.path.join(loc, "_C*.so"))]
    if not libs:
        return
    try:
        ctypes.CDLL(libs[0])
    except OSError:
        _declare_missing_ops()


def torchvision_models() -> Any:
    """``torchvision.models``, also where torchvision's compiled ops cannot load (see the module doc)."""
    prepare_torchvision()
    try:
        import torchvision.models as models
    except ImportError as exc:
        raise LabkitError(f"torchvision is not importable ({exc}); install it: pip install torchvision") from None
    return models


def compiled_ops_loaded() -> bool:
    """Whether torchvision's compiled extension loaded (False: the model definitions only)."""
    torchvision_models()
    import torchvision.extension

    return bool(torchvision.extension._has_ops())


__all__ = ["compiled_ops_loaded", "prepare_torchvision", "torchvision_models"]
