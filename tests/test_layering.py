"""The arrows point down (docs/architecture.md, "Packages and direction"): `ninfer_tui →
ninfer_http → ninfer_engine`; inside the engine the storage codecs import nothing else of ours
and the kernels only the codecs, `host_copy` and one another. Read from every module's import
statements (relative ones resolved), not from what happens to be loaded."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("ninfer_engine", "ninfer_http", "ninfer_tui")


def _imports(path: Path, tops: tuple[str, ...] = OURS) -> set[str]:
    """The modules whose top package is one of `tops` (ours by default) that `path` imports:
    `a.b` for `import a.b` and `from a.b import c`, the package's `c` for `from . import c`."""
    package = list(path.relative_to(ROOT).parts[:-1])  # (a package's __init__ too)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            found |= {name} if node.module else {f"{name}.{a.name}" for a in node.names}
    return {name for name in found if name.split(".")[0] in tops}


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package.replace(".", "/")).rglob("*.py"))


def test_the_codecs_import_nothing_else_of_ours():
    for path in _modules("ninfer_engine.codecs"):
        assert all(name.startswith("ninfer_engine.codecs") for name in _imports(path)), path


def test_the_kernels_import_only_the_codecs_host_copy_and_one_another():
    allowed = ("ninfer_engine.kernels", "ninfer_engine.codecs", "ninfer_engine.host_copy")
    for path in _modules("ninfer_engine.kernels"):
        stray = {name for name in _imports(path) if not name.startswith(allowed)}
        assert not stray, (path, stray)


def test_packages_point_down():
    for package, above in (("ninfer_engine", ("ninfer_http", "ninfer_tui")),
                           ("ninfer_http", ("ninfer_tui",))):
        for path in _modules(package):
            stray = {name for name in _imports(path) if name.split(".")[0] in above}
            assert not stray, (path, stray)


def test_the_engine_serves_no_http_and_draws_no_console():
    """`ninfer_engine` imports neither aiohttp nor textual, `ninfer_http` not textual (the
    headless start's own modules are checked at run time: tests/tui/test_serving_console.py)."""
    for package, banned in (("ninfer_engine", ("aiohttp", "textual")),
                            ("ninfer_http", ("textual",))):
        for path in _modules(package):
            assert not _imports(path, banned), path


def test_the_reader_resolves_relative_imports():
    """The check's own reading: a relative import names the module it reaches."""
    kernel = ROOT / "ninfer_engine" / "kernels" / "quant_gemv.py"
    assert {"ninfer_engine.codecs", "ninfer_engine.kernels.quant_gemv_kernels"} <= _imports(
        kernel)
    init = ROOT / "ninfer_engine" / "kv" / "__init__.py"
    assert {"ninfer_engine.codecs.kv", "ninfer_engine.kv.pages"} <= _imports(init)
