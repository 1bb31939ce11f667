"""Concrete backends, one module each.

Importing this package imports no GPU library: ``cpu`` and ``null`` are cheap, and
the GPU backends (``opencl``, ``wgpu``, ``cuda``) import their dependency only when
their module is imported.
"""
