"""Caller arguments turned into plain integers, once, before anything else uses them.

Every size, count, stride and pointer a public method receives goes through one of these
functions: ``__index__`` runs exactly once, bools are refused, and the bounds that make
later arithmetic safe (a count of at most 2**62, a 64-bit address) are checked.
"""

from __future__ import annotations

import operator

from .errors import InvalidArgumentError

__all__ = ["ADDRESS_END", "MAX_COUNT", "as_count", "as_int", "as_pointer", "ceil_div"]

#: Largest count accepted anywhere (sizes, dimensions); anything larger cannot be
#: backed by memory on any machine and is rejected before arithmetic on it.
MAX_COUNT = 2**62

#: One past the largest pointer: pointers are 64-bit addresses.
ADDRESS_END = 2**64


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, ``b > 0``."""
    return -(-a // b)


def as_int(name: str, value: object, *, what: str = "an integer") -> int:
    """Return ``value`` as a plain ``int`` through ``operator.index``; bools are refused.

    This is the one place where caller objects are turned into integers: ``__index__``
    runs exactly once, and only the plain ``int`` it returned is used afterwards.
    """
    if isinstance(value, int) and type(value) is int:
        return value
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be {what}, got a bool")
    try:
        result = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"{name} must be {what}, got {type(value).__name__}") from None
    return int(result)


def as_count(name: str, value: object) -> int:
    """Return ``value`` as a non-negative ``int`` (a size, dimension or stride).

    Raises
    ------
    InvalidArgumentError
        If ``value`` is not an integer (``bool`` included), is negative, or exceeds 2**62.
    """
    if type(value) is int and 0 <= value <= MAX_COUNT:  # the common case: a plain, valid int
        return value
    count = as_int(name, value)
    if count < 0:
        raise InvalidArgumentError(f"{name} must be >= 0, got {count}")
    if count > MAX_COUNT:
        raise InvalidArgumentError(f"{name} = {count} is too large")
    return count


def as_pointer(name: str, value: object) -> int:
    """Return ``value`` as a pointer ``int``; 0, negatives and non-integers are errors."""
    if type(value) is int and 0 < value < ADDRESS_END:  # the common case: a plain, valid int
        return value
    ptr = as_int(name, value, what="an integer pointer")
    if ptr == 0:
        raise InvalidArgumentError(f"{name} is a null pointer")
    if ptr < 0 or ptr >= ADDRESS_END:
        raise InvalidArgumentError(f"{name} = {ptr} is not a 64-bit address")
    return ptr
