"""``InferenceSession``: onnxruntime's shape, computehal's backends."""

from __future__ import annotations

import math
import os
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..backend import ComputeBackend
from ..errors import InvalidArgumentError, UnsupportedError
from . import ops_attention, ops_elementwise, ops_math, ops_movement, ops_reduce  # noqa: F401 - registers lowerings
from ._ir import Graph, ValueInfo, graph_from_model, is_float, load_model
from ._partition import FALLBACK, HOST, PRIMARY, FallbackWarning, partition
from ._plan import Border, ExecutablePlan, MemoryReport, StepUnsupported
from ._shapes import Specialized, specialize
from ._simplify import simplify
from ._weights import WeightStore

__all__ = ["InferenceSession", "NodeArg", "NodePlacement", "PlanReport", "shared_backend"]

_SHARED: dict[str, ComputeBackend] = {}
_SHARED_LOCK = threading.Lock()

#: Integer inputs up to this many elements may be frozen into a plan when shapes depend on them.
_FREEZE_LIMIT = 4096
#: Plans kept per session (one per set of input shapes, least recently used dropped first).
_MAX_PLANS = 16


def shared_backend(name: str | None) -> ComputeBackend:
    """The process-wide initialised backend for ``name`` (``None``: the best one available).

    Sessions given a name share one backend instance each (contexts and compiled kernels
    are made once); a session frees only its own memory.
    """
    from .. import create_backend

    key = "auto" if name is None else name.strip().lower()
    with _SHARED_LOCK:
        backend = _SHARED.get(key)
        if backend is None or not backend.is_initialized():
            backend = create_backend(None if key == "auto" else key, strict=key != "auto")
            _SHARED[key] = backend
        return backend


def _type_string(dtype: np.dtype[Any]) -> str:
    name = TensorProto.DataType.Name(helper.np_dtype_to_tensor_dtype(dtype)).lower()
    return f"tensor({name})"


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as onnxruntime describes it: name, type string, shape."""

    name: str
    type: str
    shape: list[int | str | None]


@dataclass(frozen=True)
class NodePlacement:
    """Where one node of the plan runs: a backend's name, ``"host"`` (NumPy), or ``"view"``."""

    name: str
    op: str
    where: str
    calls: tuple[str, ...]
    reason: str | None = None


@dataclass
class PlanReport:
    """What :meth:`InferenceSession.plan` returns: placements, borders and memory of one plan."""

    backend: str
    fallback: str | None
    nodes: list[NodePlacement]
    borders: list[Border]
    memory: list[MemoryReport]
    removed_at_load: int

    def counts(self) -> dict[str, int]:
        """Number of nodes per place."""
        out: dict[str, int] = {}
        for node in self.nodes:
            out[node.where] = out.get(node.where, 0) + 1
        return out

    @property
    def fallback_nodes(self) -> list[NodePlacement]:
        """Nodes that run on the CPU backend because the chosen backend cannot run them."""
        return [n for n in self.nodes if n.reason is not None]

    def summary(self) -> str:
        """A few lines: nodes per place, borders, memory."""
        counts = ", ".join(f"{n} on {where}" for where, n in self.counts().items())
        removed = f"{self.removed_at_load} removed or folded at load"
        lines = [f"backend {self.backend}: {counts or 'no nodes'}; {removed}"]
        if self.borders:
            total = sum(b.nbytes for b in self.borders)
            lines.append(f"partition borders: {len(self.borders)} copies, {total / 1e6:.3f} MB per run")
            for b in self.borders:
                lines.append(f"  {b.value}: {b.source} -> {b.target} ({b.nbytes} B)")
        else:
            lines.append("partition borders: none")
        for m in self.memory:
            lines.append(
                f"device memory on {m.backend}: peak {m.arena_bytes / 1e6:.3f} MB for intermediates "
                f"(naive sum {m.naive_bytes / 1e6:.3f} MB), weights {m.weight_bytes / 1e6:.3f} MB"
            )
        for n in self.fallback_nodes:
            lines.append(f"  {n.name} ({n.op}) on {n.where}: {n.reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        rows = [f"  {n.name:<32} {n.op:<20} {n.where:<8} {' '.join(n.calls)}" for n in self.nodes]
        return self.summary() + "\n" + "\n".join(rows)


def _resolve_backend(backend: ComputeBackend | str | None) -> ComputeBackend:
    if backend is None or isinstance(backend, str):
        return shared_backend(backend)
    if isinstance(backend, ComputeBackend):
        if not backend.is_initialized():
            backend.init()
        return backend
    raise InvalidArgumentError(
        f"backend must be None, a name or a ComputeBackend, got {type(backend).__name__}"
    )


class InferenceSession:
    """Run an ONNX model on a computehal backend, with onnxruntime's calling convention.

    Parameters
    ----------
    model_or_path : onnx.ModelProto, str, os.PathLike or bytes
        The model.
    backend : None, str or ComputeBackend
        ``None`` for the best backend on this machine (``COMPUTEHAL_BACKEND`` overrides),
        a name (``"cpu"``, ``"opencl"``, ``"vulkan"``, ``"cuda"``), or a backend instance.
    strict : bool
        Refuse the model (:class:`~computehal.UnsupportedError` naming the nodes) instead
        of running nodes the backend cannot run on the CPU backend.

    Notes
    -----
    At load the model is simplified once (constants folded, Identity / Dropout removed,
    batch normalisation folded into the convolution before it). A plan is made per set
    of input shapes (at load when the declared shapes are concrete): shapes inferred,
    nodes lowered to interface calls and placed, intermediates placed in an arena by
    lifetime, weights uploaded. ``run`` then executes the plan with no host round trip
    between device nodes and one ``synchronize()`` per backend.
    """

    def __init__(
        self,
        model_or_path: onnx.ModelProto | str | os.PathLike[str] | bytes,
        backend: ComputeBackend | str | None = None,
        strict: bool = False,
    ) -> None:
        model = load_model(model_or_path)
        loaded = graph_from_model(model)
        self._node_count = len(loaded.nodes)
        self._graph: Graph = simplify(loaded)
        self._backend = _resolve_backend(backend)
        self._fallback = None if self._backend.name() == "cpu" else shared_backend("cpu")
        self._strict = bool(strict)
        self._plans: OrderedDict[Any, tuple[Specialized, ExecutablePlan]] = OrderedDict()
        self._weights = WeightStore()
        self._stable = frozenset(self._graph.consts)
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_plans, self._plans, self._weights)
        self._value_keyed = False
        self._forced: dict[str, str] = {}  # nodes the backend refused when they ran
        shapes = self._declared_shapes()
        if shapes is not None:
            try:
                self._plan_for(shapes, None)
            except UnsupportedError:
                # Shapes or attributes may come from integer inputs: plan at the first run.
                if not any(not is_float(i.dtype) for i in self._graph.inputs):
                    raise

    # ------------------------------------------------------------------ description

    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs a run must feed (initializers excluded)."""
        return [NodeArg(i.name, _type_string(i.dtype), list(i.shape or [])) for i in self._graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs, in order."""
        return [NodeArg(o.name, _type_string(o.dtype), list(o.shape or [])) for o in self._graph.outputs]

    def get_providers(self) -> list[str]:
        """The backends this session may use: the chosen one, then the CPU fallback."""
        names = [self._backend.name()]
        if self._fallback is not None:
            names.append(self._fallback.name())
        return names

    @property
    def backend(self) -> ComputeBackend:
        """The chosen backend."""
        return self._backend

    def _declared_shapes(self) -> dict[str, tuple[int, ...]] | None:
        shapes = {}
        for info in self._graph.inputs:
            if info.shape is None or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in info.shape
            ):
                return None
            shapes[info.name] = tuple(int(d) for d in info.shape)  # type: ignore[arg-type]
        return shapes

    # ------------------------------------------------------------------ planning

    def _plan_for(
        self, shapes: Mapping[str, tuple[int, ...]], feeds: Mapping[str, np.ndarray] | None
    ) -> tuple[Specialized, ExecutablePlan]:
        """The plan for these input shapes (made on first use).

        Models whose shapes or attributes come from small integer inputs (split sizes,
        axes, a target shape fed at run time) get plans keyed by those values too: the
        values are frozen into the plan as constants.
        """
        key: tuple[Any, ...] = tuple(shapes[i.name] for i in self._graph.inputs)
        frozen = self._frozen(feeds) if self._value_keyed else {}
        with self._lock:
            full_key = key + tuple((n, v.tobytes()) for n, v in sorted(frozen.items()))
            found = self._plans.get(full_key)
            if found is not None:
                self._plans.move_to_end(full_key)
                return found
            try:
                spec = specialize(self._graph, dict(shapes), frozen)
                if _needs_values(spec):
                    raise UnsupportedError("shapes depend on the values of the inputs")
                built = self._build(spec)
            except UnsupportedError:
                if frozen or feeds is None:
                    raise
                frozen = self._frozen(feeds)
                if not frozen:
                    raise
                spec = specialize(self._graph, dict(shapes), frozen)
                built = self._build(spec)
                self._value_keyed = True
                full_key = key + tuple((n, v.tobytes()) for n, v in sorted(frozen.items()))
            self._plans[full_key] = built
            while len(self._plans) > _MAX_PLANS:
                _, (_, oldest) = self._plans.popitem(last=False)
                oldest.close()
            return built

    def _build(self, spec: Specialized) -> tuple[Specialized, ExecutablePlan]:
        plans, ctx = partition(
            spec, self._backend, self._fallback, strict=self._strict, stable=self._stable, forced=self._forced
        )
        return spec, ExecutablePlan(plans, ctx, self._backend, self._fallback, self._weights)

    def _frozen(self, feeds: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        if not feeds:
            return {}
        return {
            name: value
            for name, value in feeds.items()
            if not is_float(value.dtype) and value.size <= _FREEZE_LIMIT
        }

    def plan(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> PlanReport:
        """Where every node runs, the partition borders and the device memory of a plan.

        ``input_shapes`` selects the plan (default: the declared shapes, or the most
        recently used plan).
        """
        if input_shapes is not None:
            spec, executable = self._plan_for({k: tuple(v) for k, v in input_shapes.items()}, None)
        elif self._plans:
            spec, executable = list(self._plans.values())[-1]
        else:
            shapes = self._declared_shapes()
            if shapes is None:
                raise InvalidArgumentError("the model's input shapes are not fixed: pass input_shapes")
            spec, executable = self._plan_for(shapes, None)
        names = {PRIMARY: self._backend.name(), HOST: "host"}
        if self._fallback is not None:
            names[FALLBACK] = self._fallback.name()
        nodes = []
        for p in executable.plans:
            where = "view" if p.is_view else names[p.where]
            calls = tuple(getattr(i, "method", "upload") for i in p.instrs) if p.where != HOST else ("numpy",)
            nodes.append(NodePlacement(p.node.name, p.node.op, where, calls, p.reason))
        return PlanReport(
            self._backend.name(),
            None if self._fallback is None else self._fallback.name(),
            nodes,
            list(executable.borders),
            executable.memory(),
            self._node_count - len(spec.graph.nodes),
        )

    # ------------------------------------------------------------------ running

    def _check_feeds(self, input_feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(input_feed, Mapping):
            raise InvalidArgumentError(
                f"input_feed must be a mapping of name -> array, got {type(input_feed).__name__}"
            )
        expected = {i.name: i for i in self._graph.inputs}
        unknown = sorted(set(input_feed) - set(expected))
        if unknown:
            raise InvalidArgumentError(f"unknown inputs {unknown}; the model takes {sorted(expected)}")
        feeds: dict[str, np.ndarray] = {}
        for name, info in expected.items():
            if name not in input_feed:
                raise InvalidArgumentError(f"input {name!r} is missing")
            feeds[name] = _checked(info, input_feed[name])
        return feeds

    def run(
        self,
        output_names: Iterable[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[np.ndarray]:
        """Run the model; return the requested outputs (all when ``output_names`` is None)."""
        feeds = self._check_feeds(input_feed)
        outputs = [o.name for o in self._graph.outputs]
        wanted = outputs if output_names is None else list(output_names)
        for name in wanted:
            if name not in outputs:
                raise InvalidArgumentError(f"unknown output {name!r}; the model has {outputs}")
        shapes = {name: tuple(value.shape) for name, value in feeds.items()}
        while True:
            _, executable = self._plan_for(shapes, feeds)
            try:
                results = executable.run(feeds)
                break
            except StepUnsupported as exc:
                self._move_to_fallback(exc)
        by_name = dict(zip(outputs, results, strict=True))
        return [by_name[name] for name in wanted]

    def _move_to_fallback(self, exc: StepUnsupported) -> None:
        """Re-plan with a node the backend refused at run time on the CPU backend (or refuse)."""
        if self._strict or self._fallback is None or exc.node in self._forced:
            raise UnsupportedError(str(exc)) from exc
        self._forced[exc.node] = f"refused when it ran: {exc.reason}"
        warnings.warn(
            f"node {exc.node!r} runs on the CPU backend: {exc.reason}", FallbackWarning, stacklevel=3
        )
        with self._lock:
            for _, executable in self._plans.values():
                executable.close()
            self._plans.clear()

    def close(self) -> None:
        """Free the device memory of every plan (the session cannot run afterwards)."""
        self._finalizer()

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _needs_values(spec: Specialized) -> bool:
    for node in spec.graph.nodes:
        for name in node.outputs:
            if name and name in spec.dtypes and is_float(spec.dtypes[name]) and name not in spec.shapes:
                return True
    return False


def _checked(info: ValueInfo, value: Any) -> np.ndarray:
    try:
        array = np.ascontiguousarray(value)
    except Exception as exc:  # noqa: BLE001 - anything that is not array-like
        raise InvalidArgumentError(f"input {info.name!r} is not an array: {exc}") from None
    if array.dtype != info.dtype:
        raise InvalidArgumentError(f"input {info.name!r} must be {info.dtype.name}, got {array.dtype.name}")
    if info.shape is not None:
        dims = [d for d in info.shape if isinstance(d, int)]
        if array.ndim != len(info.shape) and len(dims) == len(info.shape) and array.size == math.prod(dims):
            array = array.reshape(tuple(dims))
        if array.ndim != len(info.shape):
            raise InvalidArgumentError(
                f"input {info.name!r} must have {len(info.shape)} dimensions, got shape {list(array.shape)}"
            )
        for axis, (want, got) in enumerate(zip(info.shape, array.shape, strict=True)):
            if isinstance(want, int) and want != got:
                raise InvalidArgumentError(
                    f"input {info.name!r} has {got} entries on axis {axis}, the model declares {want}"
                )
    return array


def _close_plans(plans: dict[Any, tuple[Specialized, ExecutablePlan]], weights: WeightStore) -> None:
    for _, executable in plans.values():
        executable.close()
    plans.clear()
    weights.close()
