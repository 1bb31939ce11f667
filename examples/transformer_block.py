"""One transformer block forward on the auto-selected backend, checked against the CPU.

Uses only computehal's public API: ``computehal.auto()`` picks the best backend on
this machine (``COMPUTEHAL_BACKEND=opencl`` forces one), ``computehal.last_selection()``
says why, and the very same code runs on ``computehal.CpuBackend`` as the reference.

The block (pre-norm omitted; every tensor float32, row-major):

    Q_h, K_h, V_h = X @ Wq[:, h], X @ Wk[:, h], X @ Wv[:, h]   batched_gemm over heads
    A_h  = attention(Q_h, K_h, V_h, causal)                    attention
    A    = concat_h A_h                                        gather (head-major -> token-major)
    H1   = X + A @ Wo                                          gemm, binary add
    U    = H1 @ W1;  G = U * sigmoid(U)                        gemm, unary sigmoid, binary mul (SiLU)
    Y    = H1 + G @ W2                                         gemm, binary add
    P    = softmax(mean_over_tokens(Y) @ Wcls)                 reduce mean, gemm, softmax

Run: ``python examples/transformer_block.py`` (add ``-v`` to log the selection).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

import computehal
from computehal import BinaryOp, ComputeBackend, ReduceOp, UnaryOp

F32 = np.float32
Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Config:
    """Sizes of the block: tokens, model width, heads, MLP width, classes."""

    seq: int = 64
    d_model: int = 128
    heads: int = 4
    d_ff: int = 256
    classes: int = 10

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


def make_weights(cfg: Config, seed: int = 0) -> dict[str, Array]:
    """Random weights (scaled like a freshly initialised model) and an input."""
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> Array:
        return (rng.standard_normal((rows, cols)) / math.sqrt(rows)).astype(F32)

    d, f = cfg.d_model, cfg.d_ff
    return {
        "x": rng.standard_normal((cfg.seq, d)).astype(F32),
        "wq": mat(d, d),
        "wk": mat(d, d),
        "wv": mat(d, d),
        "wo": mat(d, d),
        "w1": mat(d, f),
        "w2": mat(f, d),
        "wcls": mat(d, cfg.classes),
    }


class Device:
    """Allocations on one backend, freed together."""

    def __init__(self, backend: ComputeBackend) -> None:
        self.backend = backend
        self.pointers: list[int] = []

    def upload(self, array: Array) -> int:
        ptr = self.empty(array.size)
        self.backend.copy_htod(ptr, np.ascontiguousarray(array, dtype=F32))
        return ptr

    def empty(self, count: int) -> int:
        ptr = self.backend.alloc(count * 4)
        self.pointers.append(ptr)
        return ptr

    def download(self, ptr: int, shape: tuple[int, ...]) -> Array:
        out = np.empty(shape, dtype=F32)
        self.backend.copy_dtoh(out, ptr)
        return out

    def free_all(self) -> None:
        for ptr in reversed(self.pointers):
            self.backend.free(ptr)
        self.pointers.clear()


def linear(be: ComputeBackend, x: int, rows: int, d_in: int, w: int, d_out: int, y: int) -> None:
    """Row-major ``Y[rows, d_out] = X[rows, d_in] @ W[d_in, d_out]`` as one column-major GEMM.

    Row-major data is the transpose in column-major terms, so Y^T = W^T X^T needs no copy:
    W^T is W's storage read column-major with ld = d_out, likewise X^T with ld = d_in.
    """
    be.gemm("N", "N", d_out, rows, d_in, 1.0, w, d_out, x, d_in, 0.0, y, d_out, dtype="float32")


def forward(backend: ComputeBackend, cfg: Config, weights: dict[str, Array]) -> dict[str, Array]:
    """Run the block on ``backend``; return the hidden output and the class probabilities."""
    dev = Device(backend)
    be = backend
    s, d, h, hd, f = cfg.seq, cfg.d_model, cfg.heads, cfg.head_dim, cfg.d_ff
    try:
        p = {name: dev.upload(value) for name, value in weights.items()}

        # Q, K, V per head, written straight into [heads, seq, head_dim] (batch 1): one
        # strided batched GEMM per projection. Head j uses W[:, j*hd:(j+1)*hd], i.e. rows
        # j*hd.. of W^T: an interior pointer, stride hd elements; X is shared (stride 0).
        qkv = {}
        for name in ("wq", "wk", "wv"):
            out = dev.empty(h * s * hd)
            # fmt: off
            be.batched_gemm(
                "N", "N", hd, s, d,
                1.0, p[name], d, hd,  # A_j: rows j*hd.. of W^T, stride hd elements
                p["x"], d, 0,  # B: X^T, shared by every head (stride 0)
                0.0, out, hd, s * hd,  # C_j: Q_j^T, one [seq, head_dim] block per head
                h, dtype="float32",
            )
            # fmt: on
            qkv[name] = out
        heads_out = dev.empty(h * s * hd)
        be.attention(qkv["wq"], qkv["wk"], qkv["wv"], heads_out, 1, h, s, s, hd, 1.0 / math.sqrt(hd), True)

        # Concatenate heads: token-major row (t*h + j) is head-major row (j*s + t).
        concat = dev.empty(s * d)
        be.gather(heads_out, [j * s + t for t in range(s) for j in range(h)], concat, h * s, hd)

        attn = dev.empty(s * d)
        linear(be, concat, s, d, p["wo"], d, attn)
        h1 = dev.empty(s * d)
        be.binary(BinaryOp.ADD, p["x"], attn, h1, s * d)

        # MLP with SiLU: G = U * sigmoid(U).
        u = dev.empty(s * f)
        linear(be, h1, s, d, p["w1"], f, u)
        gate = dev.empty(s * f)
        be.unary(UnaryOp.SIGMOID, u, gate, s * f)
        be.binary(BinaryOp.MUL, u, gate, gate, s * f)
        mlp = dev.empty(s * d)
        linear(be, gate, s, f, p["w2"], d, mlp)
        y = dev.empty(s * d)
        be.binary(BinaryOp.ADD, h1, mlp, y, s * d)

        # Classifier head on the mean token.
        pooled = dev.empty(d)
        be.reduce(ReduceOp.MEAN, y, pooled, [s, d], 0)
        logits = dev.empty(cfg.classes)
        linear(be, pooled, 1, d, p["wcls"], cfg.classes, logits)
        probs = dev.empty(cfg.classes)
        be.softmax(logits, probs, [1, cfg.classes], 1)

        be.synchronize()
        return {
            "hidden": dev.download(y, (s, d)),
            "probabilities": dev.download(probs, (cfg.classes,)),
        }
    finally:
        dev.free_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-v", "--verbose", action="store_true", help="log the backend selection")
    parser.add_argument("--backend", help="a backend name instead of auto(), e.g. opencl or cuda:1")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest accepted max error")
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    cfg = Config()
    weights = make_weights(cfg)
    backend = computehal.create_backend(args.backend) if args.backend else computehal.auto()
    selection = computehal.last_selection()
    try:
        result = forward(backend, cfg, weights)
    except computehal.BackendError as exc:
        print(f"FAILED on {backend.name()}: {exc}")
        return 1
    finally:
        backend.close()
    with computehal.CpuBackend() as cpu:
        expected = forward(cpu, cfg, weights)

    print(f"backend: {backend.name()}")
    if selection is not None:
        print(selection.summary())
    errors: dict[str, Any] = {}
    for name in ("hidden", "probabilities"):
        errors[name] = float(np.max(np.abs(result[name].astype(np.float64) - expected[name])))
        print(f"max |{name} - cpu reference| = {errors[name]:.3e}")
    predicted, reference = (int(np.argmax(r["probabilities"])) for r in (result, expected))
    print(f"predicted class: {predicted} (cpu reference: {reference})")
    worst = max(errors.values())
    if not worst <= args.tolerance:
        print(f"FAILED: max error {worst:.3e} > {args.tolerance:g}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
