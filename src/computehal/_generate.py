"""Methods generated from the signatures of :class:`~computehal.ComputeBackend`.

The ABC is the one place where every public signature is written. Classes that only
route calls (``ForwardingBackend``, ``NullBackend``, and the validating dispatcher of
``TableBackend``) get their methods generated here, with the ABC's parameter names,
order, defaults and annotations, so a signature can never drift from the contract.
Generated code is plain Python (as ``dataclasses`` writes ``__init__``): calls cost no
more than hand-written forwarding.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["method_from"]


def _parameters(template: Callable[..., Any]) -> tuple[str, str, dict[str, Any]]:
    """(parameter list source, call argument source, defaults namespace) of ``template``."""
    sig = inspect.signature(template)
    params = list(sig.parameters.values())[1:]  # drop self
    defs: list[str] = []
    call: list[str] = []
    defaults: dict[str, Any] = {}
    star = False
    for p in params:
        if p.kind is p.VAR_POSITIONAL or p.kind is p.VAR_KEYWORD:
            raise TypeError(f"{template.__qualname__}: *args / **kwargs cannot be generated")
        text = p.name
        if p.default is not p.empty:
            defaults[f"_default_{p.name}"] = p.default
            text += f"=_default_{p.name}"
        if p.kind is p.KEYWORD_ONLY:
            if not star:
                defs.append("*")
                star = True
            call.append(f"{p.name}={p.name}")
        else:
            call.append(p.name)
        defs.append(text)
    return ", ".join(defs), ", ".join(call), defaults


def method_from(
    template: Callable[..., Any],
    body: str,
    namespace: dict[str, Any],
    *,
    qualname: str,
) -> Callable[..., Any]:
    """A method with ``template``'s signature whose body is ``body``.

    ``body`` is one or more lines of Python; ``{call}`` in it is replaced by the
    parameters as call arguments (``a, b, dtype=dtype``) and ``{name}`` by the method
    name. ``namespace`` supplies the names the body uses.
    """
    name = template.__name__
    params, call, defaults = _parameters(template)
    lines = body.format(call=call, name=name).splitlines()
    source = f"def {name}(self, {params}):\n" + "".join(f"    {line}\n" for line in lines)
    scope: dict[str, Any] = {**namespace, **defaults}
    exec(compile(source, f"<computehal generated {qualname}>", "exec"), scope)  # noqa: S102
    fn: Callable[..., Any] = scope[name]
    fn.__doc__ = template.__doc__
    fn.__annotations__ = dict(getattr(template, "__annotations__", {}))
    fn.__qualname__ = qualname
    fn.__module__ = namespace.get("__name__", fn.__module__)
    return fn
