"""pagedkv dtype names to torch dtypes."""

from __future__ import annotations

import torch

from pagedkv.dtypes import canonical_dtype_name
from pagedkv.tensors.errors import TensorLayoutError

__all__ = [
    "torch_dtype",
]

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "uint8": torch.uint8,
}


def torch_dtype(dtype: str, *, layer_name: str = "?") -> torch.dtype:
    """The torch dtype storing ``dtype`` element by element.

    Packed formats with inline scales (``int8_per_token_head``, ``nvfp4`` ...) have no
    element-wise torch dtype and raise TensorLayoutError naming ``layer_name``.
    """
    name = canonical_dtype_name(dtype)
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise TensorLayoutError(
            f"layer {layer_name!r}: KV cache dtype {name!r} is a packed format with no "
            f"element-wise torch dtype; supported: {', '.join(_TORCH_DTYPES)}"
        ) from None
