"""A small network forward pass on the best backend, with NumPy on both ends.

NumPy loads the data and the weights; computehal runs ``softmax(relu(x @ W1 + b1) @ W2
+ b2)`` on whatever ``computehal.auto()`` picks (CUDA, OpenCL, wgpu or the CPU); the
probabilities come back to NumPy through DLPack, without a copy on the CPU backend.

Run it with ``python examples/numpy_network.py``; ``COMPUTEHAL_BACKEND=cpu`` pins the
backend.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

import computehal as ch
from computehal import array as ca


def load_data() -> dict[str, np.ndarray[Any, Any]]:
    """A batch of inputs and the weights of a 16 -> 32 -> 10 classifier, as NumPy arrays.

    A real program would call ``np.load("model.npz")``; here the file is written to
    memory first so that the example is self-contained.
    """
    rng = np.random.default_rng(0)
    file = io.BytesIO()
    np.savez(
        file,
        x=rng.standard_normal((64, 16)).astype(np.float32),
        w1=(rng.standard_normal((16, 32)) / 4).astype(np.float32),
        b1=(rng.standard_normal(32) / 10).astype(np.float32),
        w2=(rng.standard_normal((32, 10)) / 6).astype(np.float32),
        b2=(rng.standard_normal(10) / 10).astype(np.float32),
    )
    file.seek(0)
    with np.load(file) as data:
        return {name: data[name] for name in data.files}


def pick_backend() -> ch.ComputeBackend:
    """The best backend on this machine (``computehal.auto()``), or the CPU backend."""
    try:
        backend = ch.auto()
    except (AttributeError, ImportError, ch.BackendError):
        backend = ch.CpuBackend()
        backend.init()
    return backend


def forward(backend: ch.ComputeBackend, data: dict[str, np.ndarray[Any, Any]]) -> ca.DeviceArray:
    """``softmax(relu(x @ W1 + b1) @ W2 + b2)`` on ``backend``; returns the probabilities."""
    batch = data["x"].shape[0]
    x = ch.asarray(data["x"], backend)
    w1 = ch.asarray(data["w1"], backend)
    w2 = ch.asarray(data["w2"], backend)
    # The element-wise ops do not broadcast: upload the biases once per batch row.
    b1 = ch.asarray(np.broadcast_to(data["b1"], (batch, data["b1"].size)), backend)
    b2 = ch.asarray(np.broadcast_to(data["b2"], (batch, data["b2"].size)), backend)

    hidden = ca.matmul(x, w1)  # (64, 32): one gemm on the row-major arrays, no copies
    ca.add(hidden, b1, out=hidden)
    ca.relu(hidden, out=hidden)
    logits = ca.matmul(hidden, w2)  # (64, 10)
    ca.add(logits, b2, out=logits)
    return ca.softmax(logits, axis=1, out=logits)


def reference(data: dict[str, np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """The same network in float64 NumPy."""
    h = np.maximum(data["x"].astype(np.float64) @ data["w1"] + data["b1"], 0)
    z = h @ data["w2"] + data["b2"]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    probabilities: np.ndarray[Any, Any] = e / e.sum(axis=1, keepdims=True)
    return probabilities


def main(backend: ch.ComputeBackend | None = None) -> None:
    """Run the example on ``backend`` (default: :func:`pick_backend`)."""
    be = backend if backend is not None else pick_backend()
    print(f"backend: {be.name()}")
    data = load_data()
    probs = forward(be, data)

    # Hand the result to NumPy. On the CPU backend this is a view of the same memory.
    result = np.from_dlpack(probs)
    np.testing.assert_allclose(result, reference(data), rtol=1e-4, atol=1e-6)
    zero_copy = probs.__dlpack_device__() == (1, 0) and be.name() == "cpu"
    if zero_copy:
        saved = float(result[0, 0])
        result[0, 0] = 123.0  # write through NumPy ...
        assert probs.numpy()[0, 0] == 123.0  # ... and read it back through the backend
        result[0, 0] = saved
        assert np.shares_memory(result, probs.numpy(copy=False))
        print("result handed to NumPy without a copy")
    else:
        print(f"result copied to NumPy (the {be.name()} backend's memory is not host memory)")
    predictions = result.argmax(axis=1)
    print(f"predicted classes of the first 10 rows: {predictions[:10].tolist()}")
    print(f"row sums: min {result.sum(axis=1).min():.6f}, max {result.sum(axis=1).max():.6f}")
    probs.free()
    if backend is None:
        be.close()


if __name__ == "__main__":
    main()
