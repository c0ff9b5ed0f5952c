"""The import rules of docs/design.md ("What may import what"), read from the code's own import
statements: a change that makes the spine import an op, the runtime import anything above it, or the CuTe
GEMMs import the NVRTC path fails here, not in a review."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "cute_kernels"


def _imports(path: Path) -> set[str]:
    """The cute_kernels modules ``path`` imports (absolute names), at any depth of the file."""
    module = ["cute_kernels", *path.relative_to(ROOT).with_suffix("").parts]
    # The package relative imports start from: the module's own for an __init__, else its parent's.
    base = module[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                module = ".".join(anchor + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("cute_kernels")}


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py")) if folder else sorted(ROOT.glob("*.py"))


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# (the modules, what they must never import)
RULES = [
    ("runtime", ["cute_kernels.ops", "cute_kernels.tools", "cute_kernels.registry", "cute_kernels.tuned",
                 "cute_kernels.torch_ops", "cute_kernels.precompile"]),
    ("ops/gemm", ["cute_kernels.tools", "cute_kernels.torch_ops",
                  "cute_kernels.ops.attention", "cute_kernels.ops.conv3d", "cute_kernels.ops.scan"]),
    ("ops/attention", ["cute_kernels.tools", "cute_kernels.torch_ops", "cute_kernels.ops.gemm",
                       "cute_kernels.ops.conv3d", "cute_kernels.ops.scan", "cute_kernels.runtime.cute_compile"]),
    ("ops/conv3d", ["cute_kernels.tools", "cute_kernels.torch_ops", "cute_kernels.ops.gemm",
                    "cute_kernels.ops.attention", "cute_kernels.ops.scan", "cute_kernels.runtime.cute_compile"]),
    ("ops/scan", ["cute_kernels.tools", "cute_kernels.torch_ops", "cute_kernels.ops.gemm",
                  "cute_kernels.ops.attention", "cute_kernels.ops.conv3d", "cute_kernels.runtime.cute_compile"]),
]
SPINE = [ROOT / "registry.py", ROOT / "tuned.py"]


@pytest.mark.parametrize("folder, forbidden", RULES, ids=[r[0] for r in RULES])
def test_a_layer_imports_nothing_above_it(folder, forbidden):
    broken = {f"{p.relative_to(ROOT)} -> {name}" for p in _modules(folder) for name in _imports(p)
              if _within(name, forbidden)}
    assert not broken, sorted(broken)


def test_the_spine_imports_no_op_and_no_tool():
    forbidden = ["cute_kernels.ops", "cute_kernels.tools", "cute_kernels.torch_ops"]
    broken = {f"{p.name} -> {name}" for p in SPINE for name in _imports(p) if _within(name, forbidden)}
    assert not broken, sorted(broken)


def test_tools_reach_ops_only_through_the_registry_and_the_public_ops():
    broken = {f"{p.relative_to(ROOT)} -> {name}" for p in _modules("tools") for name in _imports(p)
              if _within(name, ["cute_kernels.ops"])}
    assert not broken, sorted(broken)


def test_the_reader_sees_real_imports():
    """The reader itself: it must find the imports this file knows are there."""
    assert "cute_kernels.runtime.nvrtc" in _imports(ROOT / "ops" / "scan" / "lookback.py")
    assert "cute_kernels.runtime.checks" in _imports(ROOT / "ops" / "gemm" / "op.py")
    assert "cute_kernels.tuned" in _imports(ROOT / "registry.py")
