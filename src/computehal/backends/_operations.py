"""The generated public operations of :class:`~computehal.backends._base.TableBackend`.

Every operation is one generated method (:func:`operation`): it opens a lease on the
backend's pointer table, validates its arguments into a problem record, refuses a
problem whose outputs lie in frozen memory (:func:`check_writable`), and runs the
backend's hook. :func:`guarded` gives hand-written methods the same error contract.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from .. import validation as v
from .._generate import method_from
from ..backend import ComputeBackend
from ..errors import (
    BackendError,
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
    OutOfMemoryError,
    UnsupportedError,
)
from ..memory import Lease, Region

__all__ = ["check_writable", "guarded", "operation", "unimplemented"]

P = ParamSpec("P")
R = TypeVar("R")


def guarded(method: Callable[P, R]) -> Callable[P, R]:
    """Let only :class:`BackendError` escape ``method``.

    ``MemoryError`` becomes :class:`OutOfMemoryError`; any other unexpected
    exception becomes :class:`DeviceError` chained to the original, so a bug
    still shows its traceback but never breaks the error contract.
    """

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except BackendError:
            raise
        except MemoryError as exc:
            raise OutOfMemoryError() from exc
        except Exception as exc:  # noqa: BLE001 - the contract is "only BackendError escapes"
            raise DeviceError(f"{method.__name__} failed: {type(exc).__name__}: {exc}") from exc

    return wrapper


#: The body of every generated public operation: what :func:`guarded` and ``with
#: self._memory().lease()`` do, written out (one frame per call instead of four). The
#: lease counts as a running operation from its first pin (``close`` checks the table).
#: The common case of :meth:`TableBackend._dispatch` (a planned op, a native dtype, a
#: problem that :meth:`~computehal.validation.Problem.runs_as_is`) calls the hook here.
_OPERATION_BODY = """\
try:
    if not self._initialized:
        raise _NotInitializedError()
    lease = _Lease(self._table)
    try:
        p = _validate(lease, {call})
        if p.OUTPUTS:
            _writable({name!r}, p)
        plan = self._plans.get({name!r})
        if plan is not None and p.dtype in plan[0] and p.runs_as_is():
            plan[1](self, p)
        else:
            self._dispatch({name!r}, p)
    finally:
        lease.end()
except _BackendError:
    raise
except MemoryError as exc:
    raise _OutOfMemoryError() from exc
except Exception as exc:
    raise _DeviceError(f"{name} failed: {{type(exc).__name__}}: {{exc}}") from exc
"""


def check_writable(op: str, name: str, region: Region) -> None:
    """Raise InvalidArgumentError if ``region`` (the output ``name`` of ``op``) lies in frozen memory."""
    if region.allocation.frozen:
        raise InvalidArgumentError(
            f"{op}: its output ({name}) is in a frozen allocation at {region.allocation.base:#x}, "
            "which no operation may write (see freeze)"
        )


def _writable(op: str, p: v.Problem) -> None:
    """:func:`check_writable` on every output of ``p``."""
    for name in p.OUTPUTS:
        region = getattr(p, name)
        if region is not None and region.allocation.frozen:  # (on every call: the test inline)
            check_writable(op, name, region)


def operation(op: str) -> Any:
    """The public method of ``op``: open a lease, validate, dispatch (signature from the contract).

    Only the :class:`BackendError` family escapes, as from a :func:`guarded` method.
    """
    return method_from(
        getattr(ComputeBackend, op),
        _OPERATION_BODY,
        {
            "__name__": __name__,
            "_validate": v.VALIDATORS[op],
            "_writable": _writable,
            "_Lease": Lease,
            "_BackendError": BackendError,
            "_NotInitializedError": NotInitializedError,
            "_OutOfMemoryError": OutOfMemoryError,
            "_DeviceError": DeviceError,
        },
        qualname=f"TableBackend.{op}",
    )


def unimplemented(op: str) -> Callable[[Any, Any], None]:
    """The default ``_exec_<op>`` hook: raises UnsupportedError naming the op and the backend."""

    def hook(self: Any, p: Any) -> None:
        raise UnsupportedError(f"{op} is not implemented by the {self.name()} backend")

    hook.__name__ = f"_exec_{op}"
    hook.__doc__ = f"Run a validated ``{op}``; the default raises UnsupportedError."
    return hook
