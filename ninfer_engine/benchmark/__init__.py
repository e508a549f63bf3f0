"""GPU benchmarks behind `ninfer bench`: random-weight stacks at real shapes, ninfer kernels."""
