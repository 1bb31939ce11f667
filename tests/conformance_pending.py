"""Conformance tests not passing yet, per backend: the transition list of the op-set work.

Backends are being extended while the conformance kit already checks the whole
interface. Each backend's set names the kit tests (case ids ``<op>-<case>`` and
``offers-<op>-<dtype>``, fnmatch patterns allowed) that fail on it today because the
feature is not written yet. ``tests/test_conformance.py`` marks exactly these as strict
expected failures: when a backend starts passing one, the test XPASSes and fails, and
the entry must be deleted here. Never add an entry to hide a regression; ``computehal
check`` ignores this file and reports what it finds.
"""

from __future__ import annotations

import fnmatch
from typing import Any


def is_pending(backend: str, test_id: str) -> bool:
    """True when ``test_id`` (``<op>-<case>`` or ``offers-<op>-<dtype>``) is pending on ``backend``."""
    return any(fnmatch.fnmatchcase(test_id, pattern) for pattern in PENDING.get(backend, ()))


def unexpected_failures(backend: str, report: Any) -> list[str]:
    """Ids of the failed cases of a ``ConformanceReport`` that are not pending on ``backend``."""
    return [r.id for r in report.failures if not is_pending(backend, r.id)]


PENDING: dict[str, frozenset[str]] = {
    "cpu": frozenset(
        {
            "copy_strided-scalar-0d",
        }
    ),
    "opencl": frozenset(
        {
            "conv2d_forward-groups2",
            "conv2d_forward-depthwise",
            "conv2d_forward-depthwise-x2-s2",
            "conv2d_forward-dilation2",
            "conv2d_forward-dilation3x2-rect",
            "conv2d_forward-pad4-asymmetric",
            "conv2d_forward-pad4-s2",
            "conv2d_forward-pad-beyond-filter",
            "conv2d_forward-bias",
            "conv2d_forward-all-extensions",
            "conv2d_forward-all-extensions-f16",
            "conv2d_forward-all-extensions-bf16",
            "conv2d_forward-all-extensions-f32",
            "conv2d_forward-nan-inf-f16",
            "conv2d_forward-nan-inf-bf16",
            "conv2d_forward-nan-inf-f32",
            "conv2d_forward-nan-inf-extensions-f16",
            "conv2d_forward-nan-inf-extensions-bf16",
            "conv2d_forward-nan-inf-extensions-f32",
            "conv2d_backward_data-groups2",
            "conv2d_backward_data-depthwise",
            "conv2d_backward_data-depthwise-x2-s2",
            "conv2d_backward_data-dilation2",
            "conv2d_backward_data-dilation3x2-rect",
            "conv2d_backward_data-pad4-asymmetric",
            "conv2d_backward_data-pad4-s2",
            "conv2d_backward_data-pad-beyond-filter",
            "conv2d_backward_data-all-extensions",
            "conv2d_backward_data-all-extensions-f16",
            "conv2d_backward_data-all-extensions-bf16",
            "conv2d_backward_data-all-extensions-f32",
            "conv2d_backward_data-nan-inf-extensions-f16",
            "conv2d_backward_data-nan-inf-extensions-bf16",
            "conv2d_backward_data-nan-inf-extensions-f32",
            "conv2d_backward_filter-groups2",
            "conv2d_backward_filter-depthwise",
            "conv2d_backward_filter-depthwise-x2-s2",
            "conv2d_backward_filter-dilation2",
            "conv2d_backward_filter-dilation3x2-rect",
            "conv2d_backward_filter-pad4-asymmetric",
            "conv2d_backward_filter-pad4-s2",
            "conv2d_backward_filter-pad-beyond-filter",
            "conv2d_backward_filter-all-extensions",
            "conv2d_backward_filter-all-extensions-f16",
            "conv2d_backward_filter-all-extensions-bf16",
            "conv2d_backward_filter-all-extensions-f32",
            "conv2d_backward_filter-nan-inf-f16",
            "conv2d_backward_filter-nan-inf-bf16",
            "conv2d_backward_filter-nan-inf-f32",
            "conv2d_backward_filter-nan-inf-extensions-f16",
            "conv2d_backward_filter-nan-inf-extensions-bf16",
            "conv2d_backward_filter-nan-inf-extensions-f32",
            "attention-mask-full",
            "attention-mask-2d-broadcast",
            "attention-mask-key-padding",
            "attention-mask-and-causal",
            "attention-mask-long-kv",
            "attention-gqa-4-2",
            "attention-gqa-4-1-decode",
            "attention-gqa-6-3-mask-decode",
            "attention-gqa-6-3-mask-decode-f16",
            "attention-gqa-6-3-mask-decode-bf16",
            "attention-gqa-6-3-mask-decode-f32",
            "attention-nan-inf-mask-f16",
            "attention-nan-inf-mask-bf16",
            "attention-nan-inf-mask-f32",
            "attention-nan-inf-f16",
            "attention-nan-inf-bf16",
            "attention-nan-inf-f32",
            "softmax-log-axis1",
            "softmax-log-axis2",
            "softmax-log-long-rows",
            "softmax-log-large-values",
            "softmax-log-in-place",
            "softmax-log-length-1",
            "softmax-log-f16",
            "softmax-log-nan-inf-f16",
            "softmax-log-bf16",
            "softmax-log-nan-inf-bf16",
            "softmax-log-f32",
            "softmax-log-nan-inf-f32",
            "offers-conv2d_forward-float64",
            "offers-conv2d_backward_data-float64",
            "offers-conv2d_backward_filter-float64",
            "offers-attention-float64",
            "offers-reduce-float64",
            "offers-softmax-float64",
            "offers-pool2d-*",
            "offers-batch_norm-*",
            "offers-layer_norm-*",
            "offers-rms_norm-*",
            "offers-lrn-*",
        }
    ),
    "wgpu": frozenset(
        {
            "attention-nan-inf-mask-f16",
            "attention-nan-inf-mask-bf16",
            "attention-nan-inf-mask-f32",
            "fill-values-nan-inf-bf16",
        }
    ),
}
