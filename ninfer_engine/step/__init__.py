"""The step loop's parts: scheduler, runner, sampler, CUDA-graph replay, stats builder,
event hand-over (docs/architecture.md)."""
