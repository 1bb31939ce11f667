"""Which backend can run a lowered node: dtypes from its capabilities, features by a tiny probe.

Every :class:`~computehal.onnx._tensors.Call` needs a set of *atoms* ``(method, dtype,
feature)``: the method in that dtype (which ``capabilities().dtypes(method)`` answers)
and, where the call uses an optional part of the method (conv groups, a dilation, a
bias, four-sided padding; an attention mask, grouped-query heads, a causal rule;
log-softmax; a particular unary / binary / reduce / pool op; a cast target), that feature.
A feature is established by running the method once on a few bytes of this backend's
memory (for keyword features, with inputs whose result is known, so a backend that
ignores the keyword is caught too); the answer is remembered per backend instance.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..dtypes import as_float_dtype
from ..errors import BackendError, UnsupportedError
from ._tensors import Call, Upload

__all__ = ["Atom", "atoms_of", "missing"]

Atom = tuple[str, str, str | None]

_CACHE: weakref.WeakKeyDictionary[ComputeBackend, dict[Atom, str | None]] = weakref.WeakKeyDictionary()


def atoms_of(instr: Call | Upload) -> list[Atom]:
    """The atoms one instruction needs (uploads need nothing but memory)."""
    if isinstance(instr, Upload):
        return []
    method, args, kw = instr.method, instr.args, instr.kwargs
    if method == "copy_dtod":
        return [("copy_dtod", "uint8", None), ("copy_dtod", "uint8", "within")]
    dtype = str(kw.get("dtype", "float32"))
    base: Atom = (method, dtype, None)
    features: list[str] = []
    if method == "conv2d_forward":
        features += [f for f, on in (("groups", "groups" in kw), ("dilation", "dilation" in kw)) if on]
        features += ["bias"] if "bias_ptr" in kw else []
        features += ["pad4"] if len(args[7]) == 4 else []
        features += ["residual"] if "residual_ptr" in kw else []
        features += [f"activation:{kw['activation']}"] if "activation" in kw else []
    elif method == "pool2d":
        features.append(str(args[0]))
        features += [f for f in ("ceil_mode", "count_include_pad", "dilation") if f in kw]
        features += ["pad4"] if len(args[7]) == 4 else []
    elif method == "attention":
        features += ["mask"] if "mask_ptr" in kw else []
        features += ["kv_heads"] if "kv_heads" in kw else []
        features += ["cross"] if args[6] != args[7] else []
        features += ["causal"] if args[10] else []
    elif method == "softmax" and kw.get("log"):
        features.append("log")
    elif method in ("unary", "binary", "broadcast_binary", "reduce"):
        features.append(str(args[0]))
    elif method == "cast":
        features.append("to:" + str(kw.get("out_dtype", "float32")))
    elif method == "layer_norm" and ("scale_ptr" in kw or "bias_ptr" in kw):
        features.append("affine")
    return [base] + [(method, dtype, f) for f in features]


def missing(backend: ComputeBackend, atoms: Iterable[Atom]) -> str | None:
    """Why ``backend`` cannot run something needing ``atoms``, or None when it can."""
    for atom in atoms:
        reason = _check(backend, atom)
        if reason is not None:
            return reason
    return None


def _check(backend: ComputeBackend, atom: Atom) -> str | None:
    known = _CACHE.setdefault(backend, {})
    if atom in known:
        return known[atom]
    method, dtype, feature = atom
    reason: str | None = None
    if dtype not in backend.capabilities().dtypes(method):
        reason = f"{method} takes no {dtype} on {backend.name()}"
    elif feature is not None:
        reason = _probe(backend, method, dtype, feature)
    known[atom] = reason
    return reason


def _probe(backend: ComputeBackend, method: str, dtype: str, feature: str) -> str | None:
    maker = _PROBES.get(method)
    if maker is None:
        return None
    base = backend.alloc(4096)
    try:
        backend.copy_htod(base, np.zeros(4096, dtype=np.uint8))
        ptrs = (base, base + 1024, base + 2048, base + 3072)
        maker(backend, ptrs, dtype, feature)
        backend.synchronize()
    except UnsupportedError as exc:
        return str(exc)
    except _Mismatch as exc:
        return f"{method} on {backend.name()} gives wrong results with {feature} ({exc})"
    except BackendError as exc:
        return f"{method} with {feature} failed its probe: {exc}"
    finally:
        backend.free(base)
    return None


Ptrs = tuple[int, int, int, int]


class _Mismatch(Exception):
    """A probe ran but gave the wrong numbers (the backend ignores or mis-computes the feature)."""


def _put(be: ComputeBackend, ptr: int, values: Any, dt: str) -> None:
    be.copy_htod(ptr, np.ascontiguousarray(np.asarray(values, dtype=np.float64).astype(as_float_dtype(dt))))


def _expect(be: ComputeBackend, ptr: int, want: Any, dt: str) -> None:
    expected = np.asarray(want, dtype=np.float64)
    got = np.empty(expected.shape, dtype=as_float_dtype(dt))
    be.copy_dtoh(got, ptr)
    tol = 1e-2 if as_float_dtype(dt).itemsize == 2 else 1e-5
    if not np.allclose(got.astype(np.float64), expected, rtol=tol, atol=tol, equal_nan=True):
        raise _Mismatch(f"got {got.reshape(-1).tolist()}, expected {expected.reshape(-1).tolist()}")


def _conv(be: ComputeBackend, p: Ptrs, dt: str, feature: str) -> None:
    a, b, c, d = p
    if feature == "groups":
        _put(be, a, [1, 2], dt)
        _put(be, b, [3, 4], dt)
        be.conv2d_forward(
            a, (1, 2, 1, 1), b, (2, 1, 1, 1), c, (1, 2, 1, 1), (1, 1), (0, 0), dtype=dt, groups=2
        )
        _expect(be, c, [3, 8], dt)
    elif feature == "dilation":
        _put(be, a, np.arange(9), dt)
        _put(be, b, np.ones(4), dt)
        be.conv2d_forward(
            a, (1, 1, 3, 3), b, (1, 1, 2, 2), c, (1, 1, 1, 1), (1, 1), (0, 0), dtype=dt, dilation=(2, 2)
        )
        _expect(be, c, [16], dt)
    elif feature == "bias":
        _put(be, a, [2], dt)
        _put(be, b, [3], dt)
        _put(be, d, [5], dt)
        be.conv2d_forward(
            a, (1, 1, 1, 1), b, (1, 1, 1, 1), c, (1, 1, 1, 1), (1, 1), (0, 0), dtype=dt, bias_ptr=d
        )
        _expect(be, c, [11], dt)
    elif feature == "pad4":
        _put(be, a, [1, 2, 3, 4], dt)
        _put(be, b, [1], dt)
        be.conv2d_forward(a, (1, 1, 2, 2), b, (1, 1, 1, 1), c, (1, 1, 3, 2), (1, 1), (1, 0, 0, 0), dtype=dt)
        _expect(be, c, [0, 0, 1, 2, 3, 4], dt)
    elif feature == "residual":  # accumulated in place: [1, 2] * 3 + [5, 7]
        _put(be, a, [1, 2], dt)
        _put(be, b, [3], dt)
        _put(be, c, [5, 7], dt)
        be.conv2d_forward(
            a, (1, 1, 1, 2), b, (1, 1, 1, 1), c, (1, 1, 1, 2), (1, 1), (0, 0), dtype=dt, residual_ptr=c
        )
        _expect(be, c, [8, 13], dt)
    elif feature == "activation:relu":
        _put(be, a, [1, -2], dt)
        _put(be, b, [3], dt)
        be.conv2d_forward(
            a, (1, 1, 1, 2), b, (1, 1, 1, 1), c, (1, 1, 1, 2), (1, 1), (0, 0), dtype=dt, activation="relu"
        )
        _expect(be, c, [3, 0], dt)


def _pool(be: ComputeBackend, p: Ptrs, dt: str, feature: str) -> None:
    a, _, c, _ = p
    if feature in ("max", "avg"):
        be.pool2d(feature, a, (1, 1, 2, 2), c, (1, 1, 1, 1), (2, 2), (1, 1), (0, 0), dtype=dt)
    elif feature == "ceil_mode":
        be.pool2d("max", a, (1, 1, 3, 3), c, (1, 1, 2, 2), (2, 2), (2, 2), (0, 0), ceil_mode=True, dtype=dt)
    elif feature == "count_include_pad":
        be.pool2d(
            "avg", a, (1, 1, 2, 2), c, (1, 1, 3, 3), (2, 2), (1, 1), (1, 1), count_include_pad=True, dtype=dt
        )
    elif feature == "dilation":
        be.pool2d("max", a, (1, 1, 3, 3), c, (1, 1, 1, 1), (2, 2), (1, 1), (0, 0), dilation=(2, 2), dtype=dt)
    elif feature == "pad4":
        be.pool2d("max", a, (1, 1, 2, 2), c, (1, 1, 3, 2), (1, 1), (1, 1), (1, 0, 0, 0), dtype=dt)


def _attention(be: ComputeBackend, p: Ptrs, dt: str, feature: str) -> None:
    q, k, v, o = p
    e = float(np.e)
    if feature == "kv_heads":
        _put(be, q, [1, 0, 0, 1], dt)
        _put(be, k, [1, 1], dt)
        _put(be, v, [5, 6], dt)
        be.attention(q, k, v, o, 1, 2, 1, 1, 2, 1.0, False, dtype=dt, kv_heads=1)
        _expect(be, o, [5, 6, 5, 6], dt)
        return
    _put(be, k, [1, 0, 0, 1], dt)
    _put(be, v, [1, 2, 3, 4], dt)
    if feature == "mask":
        _put(be, q, [1, 0, 1, 0], dt)
        _put(be, o + 512, [0, float("-inf")], dt)
        be.attention(q, k, v, o, 1, 1, 2, 2, 2, 1.0, False, dtype=dt, mask_ptr=o + 512, mask_shape=(1, 2))
        _expect(be, o, [1, 2, 1, 2], dt)
    elif feature == "cross":
        _put(be, q, [1, 0], dt)
        be.attention(q, k, v, o, 1, 1, 1, 2, 2, 1.0, False, dtype=dt)
        _expect(be, o, [(e + 3) / (e + 1), (2 * e + 4) / (e + 1)], dt)
    elif feature == "causal":
        _put(be, q, [1, 0, 1, 0], dt)
        be.attention(q, k, v, o, 1, 1, 2, 2, 2, 1.0, True, dtype=dt)
        _expect(be, o, [1, 2, (e + 3) / (e + 1), (2 * e + 4) / (e + 1)], dt)


def _elementwise(method: str) -> Callable[[ComputeBackend, Ptrs, str, str], None]:
    def run(be: ComputeBackend, p: Ptrs, dt: str, feature: str) -> None:
        a, b, c, _ = p
        if method == "unary":
            extra: dict[str, Any] = {"alpha": 0.1} if feature == "leaky_relu" else {}
            extra.update({"lo": -1.0, "hi": 1.0} if feature == "clip" else {})
            be.unary(feature, a, c, 4, dtype=dt, **extra)
        elif method == "binary":
            be.binary(feature, a, b, c, 4, dtype=dt)
        elif method == "broadcast_binary":
            be.broadcast_binary(feature, a, (2, 1), b, (1, 2), c, (2, 2), dtype=dt)
        elif method == "reduce":
            be.reduce(feature, a, c, (2, 2), 1, dtype=dt)

    return run


def _copy(be: ComputeBackend, p: Ptrs, dt: str, feature: str) -> None:
    be.copy_dtod(p[1], p[0], 256)  # two ranges of one allocation


def _softmax(be: ComputeBackend, p: Ptrs, dt: str, feature: str) -> None:
    x = np.array([[1.0, 2.0], [3.0, 5.0]])
    _put(be, p[0], x, dt)
    be.softmax(p[0], p[2], (2, 2), 1, dtype=dt, log=True)
    shifted = x - x.max(axis=1, keepdims=True)
    _expect(be, p[2], shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)), dt)


def _cast(be: ComputeBackend, p: Ptrs, dt: str, feature: str) -> None:
    be.cast(p[0], p[2], 4, dtype=dt, out_dtype=feature.removeprefix("to:"))


def _layer_norm(be: ComputeBackend, p: Ptrs, dt: str, feature: str) -> None:
    a, b, c, d = p
    be.layer_norm(a, c, 2, 2, 1e-5, scale_ptr=b, bias_ptr=d, dtype=dt)


_PROBES: dict[str, Callable[[ComputeBackend, Ptrs, str, str], None]] = {
    "copy_dtod": _copy,
    "conv2d_forward": _conv,
    "pool2d": _pool,
    "attention": _attention,
    "unary": _elementwise("unary"),
    "binary": _elementwise("binary"),
    "broadcast_binary": _elementwise("broadcast_binary"),
    "reduce": _elementwise("reduce"),
    "softmax": _softmax,
    "cast": _cast,
    "layer_norm": _layer_norm,
}
