"""Value cases: every operation against the independent definitions of :mod:`.reference`.

One module per chapter; each case either compares the backend's result with the
definition (bit for bit, or within the tolerance its arithmetic allows) or, for a dtype
the backend does not list in ``capabilities().dtypes(op)``, checks that the call raises
:class:`~computehal.UnsupportedError` and writes nothing.
"""

from __future__ import annotations

from ._cases_attention import attention_cases
from ._cases_axis import axis_cases
from ._cases_blas import blas_cases
from ._cases_conv import conv_cases
from ._cases_conv_epilogue import conv_epilogue_cases
from ._cases_elementwise import elementwise_cases
from ._cases_mixed import mixed_cases
from ._cases_movement import movement_cases
from ._cases_norm import norm_cases
from ._cases_pool import pool_cases
from ._common import Case

__all__ = ["value_cases"]


def value_cases() -> list[Case]:
    """Every value case (grouping by op is done by the caller)."""
    return (
        blas_cases()
        + mixed_cases()
        + conv_cases()
        + conv_epilogue_cases()
        + pool_cases()
        + attention_cases()
        + axis_cases()
        + norm_cases()
        + elementwise_cases()
        + movement_cases()
    )
