"""Horovod data-parallel trainer (MNIST and offline stand-ins) and its benchmarks."""
