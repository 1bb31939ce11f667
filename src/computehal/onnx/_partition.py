"""Assigning every node of a specialised graph to where it runs.

* Nodes whose outputs are all integers (or booleans) run on the host with NumPy: they are
  small facts derived from the inputs (token ids, positions, masks, shapes).
* Every other node is lowered (:mod:`computehal.onnx._lowering`) and runs on the chosen
  backend when that backend has every method, dtype and feature its calls need; otherwise
  on the CPU backend (the fallback), with a warning; when neither can, the model is
  refused with the reasons.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..backend import ComputeBackend
from ..errors import UnsupportedError
from ._fuse import fuse
from ._host import HostNode
from ._ir import FLOAT_NAMES, Node, is_float
from ._lowering import LOWERINGS, Lowerer, LoweringContext, Unmappable
from ._shapes import Specialized
from ._support import atoms_of, missing
from ._tensors import Call, DeviceTensor, Storage, Upload

__all__ = ["BackendLacksError", "FallbackWarning", "NodePlan", "partition", "weight_panel"]

PRIMARY, FALLBACK, HOST = "primary", "fallback", "host"


class BackendLacksError(UnsupportedError):
    """The model maps onto the interface, but no available backend implements what some nodes need.

    Every refused node is refused for a missing method, dtype or feature of the chosen
    backend and of the CPU fallback (not for something the interface cannot express).
    """


class FallbackWarning(UserWarning):
    """A node runs on the CPU backend because the chosen backend cannot run it."""


@dataclass(eq=False)
class NodePlan:
    """Where one node runs and what it does there."""

    node: Node
    where: str  # PRIMARY | FALLBACK | HOST
    instrs: list[Call | Upload] = field(default_factory=list)
    storages: list[Storage] = field(default_factory=list)
    host: HostNode | None = None
    reason: str | None = None  # why it is not on the primary backend

    @property
    def is_view(self) -> bool:
        """True for a device node that is only a view of its input (no call)."""
        return self.where != HOST and not self.instrs


class _Lacks(Exception):
    """A node the interface expresses but neither backend implements."""


def _exotic(dtype: np.dtype) -> bool:
    return dtype.name.startswith("float") and dtype.name not in FLOAT_NAMES


def partition(
    spec: Specialized,
    primary: ComputeBackend,
    fallback: ComputeBackend | None,
    *,
    strict: bool = False,
    stable: frozenset[str] = frozenset(),
    forced: dict[str, str] | None = None,
) -> tuple[list[NodePlan], LoweringContext]:
    """Lower and place every node of ``spec``; raise UnsupportedError for what runs nowhere.

    ``stable`` names the constants of the model as loaded (weights keyed by name);
    ``forced`` maps nodes to the CPU fallback with the reason (refused when they ran).
    """
    fuse(spec, lambda node: _runs_on(node, spec, primary, stable))
    ctx = LoweringContext(spec, stable, weight_panel=weight_panel(primary))
    for info in spec.graph.inputs:
        ctx.host.add(info.name)
        shape = spec.shapes.get(info.name)
        if is_float(info.dtype) and shape is not None:
            size = int(np.prod(shape, dtype=np.int64)) * info.dtype.itemsize
            ctx.device[info.name] = DeviceTensor(
                Storage(max(size, 1), "input", info.name), 0, shape, info.dtype
            )
    plans: list[NodePlan] = []
    refused: list[str] = []
    lacking: list[str] = []
    for node in spec.graph.nodes:
        try:
            plans.append(_place(node, ctx, primary, fallback, (forced or {}).get(node.name)))
        except _Lacks as exc:
            lacking.append(f"{node.name} ({node.op}): {exc}")
        except (Unmappable, UnsupportedError) as exc:
            refused.append(f"{node.name} ({node.op}): {exc}")
    if refused or lacking:
        error = UnsupportedError if refused else BackendLacksError
        raise error("no backend can run these nodes: " + "; ".join(refused + lacking))
    moved = [p for p in plans if p.where == FALLBACK]
    if moved and strict:
        names = "; ".join(f"{p.node.name} ({p.node.op}): {p.reason}" for p in moved)
        raise UnsupportedError(f"strict: {primary.name()} cannot run these nodes: {names}")
    for p in moved:
        warnings.warn(
            f"node {p.node.name!r} ({p.node.op}) runs on the CPU backend: {p.reason}",
            FallbackWarning,
            stacklevel=4,
        )
    return plans, ctx


def weight_panel(backend: ComputeBackend) -> Callable[[int, int, int], int]:
    """``(rows, depth, cols) -> width``: the column panels ``backend`` wants float32 weights in (0: none)."""
    return lambda rows, depth, cols: int(backend.gemm_weight_panel(rows, depth, cols, dtype="float32"))


def _runs_on(node: Node, spec: Specialized, backend: ComputeBackend, stable: frozenset[str]) -> bool:
    """True when ``node`` lowers and ``backend`` has everything its calls need (a trial lowering)."""
    ctx = LoweringContext(spec, stable, weight_panel=weight_panel(backend))
    for name in node.present_inputs():
        info = spec.info(name)
        if name in spec.graph.consts or info is None:
            continue
        dtype, shape = info
        if is_float(dtype):
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            ctx.device[name] = DeviceTensor(Storage(max(size, 1), "arena", name), 0, shape, dtype)
        else:
            ctx.host.add(name)
    lowering = LOWERINGS.get(node.op)
    if lowering is None:
        return False
    lw = Lowerer(node, ctx)
    try:
        lowering(lw)
    except (Unmappable, UnsupportedError):
        return False
    return missing(backend, [atom for instr in lw.instrs for atom in atoms_of(instr)]) is None


def _place(
    node: Node,
    ctx: LoweringContext,
    primary: ComputeBackend,
    fallback: ComputeBackend | None,
    forced: str | None = None,
) -> NodePlan:
    spec = ctx.spec
    names = [name for name in node.outputs if name]
    if any(name not in spec.dtypes for name in names):
        raise Unmappable("the type of an output is unknown")
    dtypes = [spec.dtypes[name] for name in names]
    if any(_exotic(dt) for dt in dtypes):
        raise Unmappable("float8 / float4 tensors are outside the interface")
    if not any(is_float(dt) for dt in dtypes):
        host = HostNode(node, spec.graph.opsets)
        ctx.host.update(name for name in node.outputs if name)
        return NodePlan(node, HOST, host=host)
    if node.domain != "":
        raise Unmappable(f"operator domain {node.domain!r}")
    unknown = [n for n, dt in zip(names, dtypes, strict=True) if is_float(dt) and n not in spec.shapes]
    if unknown:
        raise Unmappable(f"the shape of {unknown[0]!r} is unknown")
    lowering = LOWERINGS.get(node.op)
    if lowering is None:
        raise Unmappable(f"no lowering for {node.op}")
    lw = Lowerer(node, ctx)
    lowering(lw)
    for name in node.outputs:
        if name and name not in lw.outputs and name not in spec.graph.consts:
            raise Unmappable(f"output {name!r} is not produced")
    ctx.device.update(lw.outputs)
    atoms = [atom for instr in lw.instrs for atom in atoms_of(instr)]
    plan = NodePlan(node, PRIMARY, lw.instrs, lw.new_storages)
    reason = forced or missing(primary, atoms)
    if reason is not None:
        if fallback is None:
            raise _Lacks(reason)
        also = missing(fallback, atoms)
        if also is not None:
            raise _Lacks(f"{reason}; on the CPU backend: {also}")
        plan.where, plan.reason = FALLBACK, reason
    for storage in plan.storages:
        storage.home = plan.where
    return plan
