"""The registry of case groups: built-in ones and those other modules add.

A group is a name and a builder ``build(ctx) -> iterable of Case / ValueCase``. Builders
are generators in practice: the harness measures each case as soon as it is yielded,
and frees every allocation the group made (through ``ctx.put`` / ``ctx.empty``) when
the group ends. A group not registered yet is looked up by convention as the module
``computehal.<name>.bench``, which registers it on import (so ``--groups onnx`` imports
``computehal.onnx.bench``); ``--plugin MODULE`` imports any other module first.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ._context import BenchContext
from ._harness import Case, ValueCase

__all__ = ["Group", "GroupBuilder", "find_group", "register_group", "registered_groups"]

GroupBuilder = Callable[[BenchContext], Iterable[Case | ValueCase]]


@dataclass(frozen=True)
class Group:
    """A registered group of benchmark cases.

    Attributes
    ----------
    name : str
    build : GroupBuilder
    description : str
        One line for ``--list``.
    default : bool
        Part of a run that does not name its groups.
    """

    name: str
    build: GroupBuilder
    description: str = ""
    default: bool = True


_GROUPS: dict[str, Group] = {}


def register_group(
    name: str, build: GroupBuilder, *, description: str = "", default: bool = False, replace: bool = False
) -> Group:
    """Add a group of cases to ``computehal bench``.

    Parameters
    ----------
    name : str
        The name given to ``--groups`` (letters, digits, ``_`` and ``-``).
    build : callable
        ``build(ctx)`` yields :class:`Case` / :class:`ValueCase` objects for the
        :class:`BenchContext` of the run (backend, sizes, ceilings, targets).
    description : str
        One line shown by ``computehal bench --list``.
    default : bool
        Run it when ``--groups`` is not given (the built-in groups are; groups added by
        other modules usually are not, since they may need optional packages).
    replace : bool
        Allow replacing a group of the same name (otherwise ``ValueError``).

    Returns
    -------
    Group
    """
    if not name or not all(ch.isalnum() or ch in "_-" for ch in name):
        raise ValueError(f"bad group name {name!r}")
    if name in _GROUPS and not replace and _GROUPS[name].build is not build:
        raise ValueError(f"a benchmark group named {name!r} is already registered")
    group = Group(name, build, description, default)
    _GROUPS[name] = group
    return group


def registered_groups() -> list[Group]:
    """Every registered group, in registration order."""
    return list(_GROUPS.values())


def find_group(name: str) -> Group | None:
    """The group ``name``, importing ``computehal.<name>.bench`` when it is not registered yet.

    Returns None when there is no such group. An import error of an existing module
    propagates (the group exists but cannot load: a missing optional package).
    """
    if name in _GROUPS:
        return _GROUPS[name]
    if not name.isidentifier() or name == "bench":
        return None
    module = f"computehal.{name}.bench"
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            return None  # no package computehal.<name>
        raise  # the package exists but needs something that is not installed
    if spec is None:
        return None
    importlib.import_module(module)
    return _GROUPS.get(name)
