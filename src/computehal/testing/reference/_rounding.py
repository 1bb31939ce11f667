"""Rounding to the storage types, written with exact float64 arithmetic.

:func:`round_to` is round-to-nearest-even computed from the definition (scale by a power
of two so the last kept bit is the units digit, ``rint``, scale back), never through a
library's conversion: NumPy converts float64 to float16 directly, but ml_dtypes converts
float64 to bfloat16 through float32 (double rounding), and neither may be the oracle of
the other.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "F64Array",
    "FORMATS",
    "dtype_name",
    "round_to",
    "storage",
    "storage_dtype",
    "ulp",
    "round_f16",
    "round_bf16",
]

F64Array = npt.NDArray[np.float64]

#: dtype name -> (significand bits including the implicit one, smallest normal exponent,
#: largest finite value).
FORMATS: dict[str, tuple[int, int, float]] = {
    "float16": (11, -14, 65504.0),
    "bfloat16": (8, -126, (2.0 - 2.0**-7) * 2.0**127),
    "float32": (24, -126, (2.0 - 2.0**-23) * 2.0**127),
    "float64": (53, -1022, float(np.finfo(np.float64).max)),
}


def dtype_name(dtype: Any) -> str:
    """The name (``"float16"``, ``"bfloat16"``, ``"float32"``, ``"float64"``) of a dtype-like value."""
    if isinstance(dtype, str):
        name = dtype.strip().lower()
        return "bfloat16" if name in ("bf16", "bfloat16") else str(np.dtype(name).name)
    if getattr(dtype, "__name__", None) == "bfloat16" or str(dtype) == "bfloat16":
        return "bfloat16"
    return str(np.dtype(dtype).name)


def storage_dtype(dtype: Any) -> np.dtype[Any]:
    """The NumPy dtype that stores ``dtype`` (ml_dtypes' bfloat16 for ``"bfloat16"``)."""
    name = dtype_name(dtype)
    if name == "bfloat16":
        import ml_dtypes

        bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
        return bf16
    return np.dtype(name)


def round_to(x: npt.ArrayLike, dtype: Any) -> F64Array:
    """``x`` rounded to nearest-even in ``dtype``, returned as float64.

    Values beyond the largest finite value (after rounding) become infinities of the
    same sign; NaN stays NaN; subnormal results keep the format's fixed smallest step.
    """
    x64 = np.array(x, dtype=np.float64)
    name = dtype_name(dtype)
    if name == "float64":
        return x64
    bits, emin, top = FORMATS[name]
    pick = np.isfinite(x64) & (x64 != 0)
    values = x64[pick]
    _, exponent = np.frexp(values)  # values = m * 2**exponent with 0.5 <= |m| < 1
    step = np.maximum(exponent - bits, emin - bits + 1)  # log2 of one unit in the last place
    rounded = np.ldexp(np.rint(np.ldexp(values, -step)), step)
    rounded = np.where(np.abs(rounded) > top, np.copysign(np.inf, values), rounded)
    x64[pick] = rounded
    return x64


def storage(x: npt.ArrayLike, dtype: Any) -> npt.NDArray[Any]:
    """``x`` rounded to ``dtype`` and held in its storage type (exactly)."""
    return round_to(x, dtype).astype(storage_dtype(dtype))


def ulp(x: npt.ArrayLike, dtype: Any) -> F64Array:
    """One unit in the last place of ``dtype`` at magnitude ``|x|`` (the subnormal step below)."""
    bits, emin, _ = FORMATS[dtype_name(dtype)]
    mag = np.abs(np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0))
    _, exponent = np.frexp(mag)
    step = np.where(mag > 0, np.maximum(exponent - bits, emin - bits + 1), emin - bits + 1)
    result: F64Array = np.ldexp(1.0, step)
    return result


def round_f16(x: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """float32 values rounded to IEEE half (nearest even), returned as float32."""
    return round_to(np.asarray(x, dtype=np.float32), "float16").astype(np.float32)


def round_bf16(x: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """float32 values rounded to bfloat16 (nearest even), returned as float32."""
    return round_to(np.asarray(x, dtype=np.float32), "bfloat16").astype(np.float32)
