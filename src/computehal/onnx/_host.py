"""Evaluating single nodes with NumPy on the host (ONNX's reference operator implementations).

Used for two things only: folding nodes whose inputs are all constants while the model
loads, and the integer tensors that depend on the inputs (token ids, positions, shapes
built from them), which the plan computes on the host as part of its CPU partition.
Float tensors that depend on the inputs are never computed here.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from onnx import helper

from ..errors import InvalidArgumentError, UnsupportedError
from ._ir import Node

__all__ = ["HostNode", "NOT_FOLDABLE"]

#: Ops whose result is not a function of their inputs (never folded).
NOT_FOLDABLE = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
    }
)


class HostNode:
    """A node evaluated on the host by ONNX's NumPy reference implementation of its operator."""

    def __init__(self, node: Node, opsets: dict[str, int]) -> None:
        from onnx.reference import ReferenceEvaluator

        self.node = node
        self.inputs = list(node.inputs)
        try:
            # A one-node function carries the model's opset versions (a bare NodeProto would
            # be evaluated with the newest version of its operator).
            proto = node.to_proto()
            imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
            function = helper.make_function(
                "computehal",
                "host_node",
                [n for n in node.inputs if n],
                [n for n in node.outputs if n],
                [proto],
                imports,
            )
            self._evaluator = ReferenceEvaluator(function)
        except Exception as exc:  # noqa: BLE001 - an op the reference does not know
            raise UnsupportedError(f"{node.op} has no host implementation: {exc}") from None

    def __call__(self, *values: np.ndarray | None) -> list[np.ndarray]:
        feeds: dict[str, Any] = {}
        for name, value in zip(self.inputs, values, strict=True):
            if name and value is not None:
                feeds[name] = value
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                results = self._evaluator.run(None, feeds, attributes={})
        except Exception as exc:  # noqa: BLE001 - bad values (shapes that disagree, ...)
            raise InvalidArgumentError(
                f"node {self.node.name!r} ({self.node.op}) failed on the host: {type(exc).__name__}: {exc}"
            ) from None
        return [np.asarray(r) for r in results]
