"""Benchmarks for tpu-inductor: run as ``python -m benchmarks.<name>``."""
