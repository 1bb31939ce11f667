"""The ``onnx`` group of ``computehal bench``: whole models against onnxruntime's CPU provider.

``computehal bench --backend cpu --groups onnx`` times, in one run and interleaved round by
round with onnxruntime on the same model and inputs:

* ResNet-50 (the ``onnx`` package's light graph with its constant weights replaced by
  random ones of the same shapes) at batch 1 and 8;
* a BERT-base-shaped encoder (12 layers, hidden 768, 12 heads, feed-forward 3072) at
  sequence 128 and 512;
* one GPT-style decoding step with a key/value cache (12 layers, hidden 768, 12 heads,
  512 cached positions, vocabulary 32000).

Each row is the time per run and its ratio to onnxruntime's (on the CPU profile the
target is 1.5x for ResNet-50 and the encoder). Every timed run, ours and onnxruntime's,
starts after a pause of :data:`ONNXRUNTIME_SETTLE_SECONDS`: onnxruntime's intra-op
threads spin after a run returns (about 40 ms of CPU time on the two vCPUs measured
here, over 20-50 ms), and the OpenBLAS threads some of our layers use spin for about
0.1 s, so without the pause each side would run with the other's idle threads holding
the cores (the harness pauses for BLAS limits the same way). On OpenCL and Vulkan devices the same
models run on the device and the ratio to onnxruntime on the host is reported without
a verdict. ``--quick`` shrinks the models to a smoke test (2 layers, batch 1).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..bench import BLAS_SETTLE_SECONDS, BenchContext, Case, Limit, Target, register_group
from . import models
from ._partition import FallbackWarning
from ._session import InferenceSession

__all__ = ["ONNXRUNTIME_SETTLE_SECONDS", "onnx_cases"]

#: Pause before each timed run of a model row (see the module notes); BLAS's pause.
ONNXRUNTIME_SETTLE_SECONDS = BLAS_SETTLE_SECONDS


def _onnxruntime(model: Any) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _relative_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        scale = float(np.max(np.abs(w))) or 1.0
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w))) / scale)
    return worst


def _case(
    ctx: BenchContext, op: str, params: str, model: Any, feeds: dict[str, np.ndarray], target: float | None
) -> tuple[Case, InferenceSession]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        session = InferenceSession(model, backend=ctx.backend)
        # The plan for these shapes is made here (not timed, nothing run yet).
        placement = session.plan({k: v.shape for k, v in feeds.items()}).counts()
    reference = _onnxruntime(model)
    where = ", ".join(f"{n} {w}" for w, n in placement.items())

    def verify() -> float:
        return _relative_error(session.run(None, feeds), reference.run(None, feeds))

    case = Case(
        op=op,
        params=f"{params} [{where}]",
        run=lambda: session.run(None, feeds),
        unit="ms",
        work=0.0,
        limit=Limit(
            "onnxruntime CPU",
            lambda: reference.run(None, feeds),
            0.0,
            settle=ONNXRUNTIME_SETTLE_SECONDS,
            kind="reference",
        ),
        target=Target("time", target) if target is not None and ctx.profile == "cpu" else None,
        verify=verify,
        tolerance=1e-3,
    )
    return case, session


def _resnet(ctx: BenchContext, batch: int) -> tuple[str, str, Any, dict[str, np.ndarray], float | None]:
    model = models.with_random_weights(models.light_model("resnet50"), seed=0)
    x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    name = model.graph.input[0].name
    model = models.batch_free(model)
    return "onnx resnet50", f"batch {batch}", model, {name: x}, 1.5


def _bert(ctx: BenchContext, sequence: int) -> tuple[str, str, Any, dict[str, np.ndarray], float | None]:
    layers, hidden, heads = (2, 256, 4) if ctx.quick else (12, 768, 12)
    model = models.bert_encoder(layers=layers, hidden=hidden, heads=heads, vocab=30522, max_positions=512)
    feeds = models.bert_inputs(1, sequence, vocab=30522)
    return "onnx bert encoder", f"{layers}x{hidden}, seq {sequence}", model, feeds, 1.5


def _gpt(ctx: BenchContext, past: int) -> tuple[str, str, Any, dict[str, np.ndarray], float | None]:
    layers, hidden, heads = (2, 256, 4) if ctx.quick else (12, 768, 12)
    model = models.gpt_decoder_step(
        layers=layers, hidden=hidden, heads=heads, vocab=32000, max_positions=2048
    )
    feeds = models.gpt_inputs(model, 1, past, vocab=32000)
    return "onnx gpt decoder step", f"{layers}x{hidden}, cache {past}", model, feeds, None


def onnx_cases(ctx: BenchContext) -> Iterator[Case]:
    """The rows of the group (one session alive at a time)."""
    plans = [(_resnet, 1), (_bert, 128), (_gpt, 128 if ctx.quick else 512)]
    if not ctx.quick:
        plans[1:1] = [(_resnet, 8)]
        plans[3:3] = [(_bert, 512)]
    for build, size in plans:
        op, params, model, feeds, target = build(ctx, size)
        case, session = _case(ctx, op, params, model, feeds, target)
        try:
            yield case
        finally:
            session.close()


register_group(
    "onnx", onnx_cases, description="ResNet-50, a BERT-base encoder and a GPT decoder step vs onnxruntime"
)
