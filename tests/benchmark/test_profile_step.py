"""`bench/profile_step.py`'s timeline reading: the GPU's idle gaps among profiler events and
the host work begun in each (the verify step's host gap is found this way on the device)."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("profile_step", ROOT / "bench" / "profile_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _event(name: str, device: str, start: float, end: float):
    return SimpleNamespace(name=name, device_type=SimpleNamespace(name=device),
                           time_range=SimpleNamespace(start=start, end=end))


def test_idle_gaps_start_when_every_kernel_so_far_has_ended():
    events = [
        _event("graph_kernel_a", "CUDA", 0, 100),
        _event("graph_kernel_b", "CUDA", 10, 150),  # overlaps a: no gap until 150
        _event("small", "CUDA", 160, 165),  # 10 µs after: under the 20-µs floor
        _event("argmax", "CUDA", 300, 305),  # a 135-µs gap before it
        _event("ninfer_engine/step/postprocess.py(31): _finish", "CPU", 170, 260),
        _event("aten::copy_", "CPU", 200, 210),
        _event("aten::copy_", "CPU", 280, 400),  # runs past the gap: counted inside it only
        _event("ninfer_engine/engine.py(1): step", "CPU", 0, 500),  # began before the gap
        _event("torch/profiler/profiler.py(1): start", "CPU", 180, 190),  # not ours
    ]
    (gap, top), = _tool().idle_gaps(events)
    assert gap == 135
    assert top == [("ninfer_engine/step/postprocess.py(31): _finish", 90),
                   ("aten::copy_", 30)]
