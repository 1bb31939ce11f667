"""The friendly layer over pointers: device arrays and array-level operations.

:class:`DeviceArray` owns (or borrows) an allocation of a backend and knows its shape,
dtype and strides; the functions here turn array operands into the pointer, shape and
leading-dimension arguments of one :class:`~computehal.ComputeBackend` call each, with
the arrays' own dtype (so float64 NumPy data stays float64 where the device has it).
The pointer API stays the contract: every array exposes ``.ptr`` and ``.backend``, and
nothing in this layer computes a number itself.

Modules: ``_core`` (the array), ``_holder`` (ownership), ``_create`` (``empty``,
``zeros``, ``asarray``), ``_dlpack`` (DLPack interop, :func:`from_dlpack`), and one
module per family of functions: ``_linalg``, ``_nn``, ``_reduce``, ``_elementwise``,
``_movement``.

Examples
--------
>>> import numpy as np
>>> import computehal as ch
>>> from computehal import array as ca
>>> with ch.CpuBackend() as be:
...     a = ch.asarray(np.ones((2, 3), np.float32), be)
...     b = ch.asarray(np.ones((3, 4), np.float32), be)
...     c = ca.relu(ca.matmul(a, b))
...     np.from_dlpack(c)[0, 0].item()
3.0
"""

from . import _elementwise, _linalg, _movement, _nn, _reduce
from ._core import Device, DeviceArray
from ._create import asarray, empty, full, to_device, zeros
from ._dlpack import from_dlpack

# Each family module lists its public functions once, in its own ``__all__``.
from ._elementwise import *  # noqa: F403
from ._linalg import *  # noqa: F403
from ._movement import *  # noqa: F403
from ._nn import *  # noqa: F403
from ._reduce import *  # noqa: F403

__all__ = ["Device", "DeviceArray", "asarray", "to_device", "empty", "zeros", "full", "from_dlpack"]
__all__ += _linalg.__all__
__all__ += _nn.__all__
__all__ += _reduce.__all__
__all__ += _elementwise.__all__
__all__ += _movement.__all__
