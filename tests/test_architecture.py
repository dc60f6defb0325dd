"""The package's layers as docs/architecture.md draws them: every import in every module of
minilms (lazy ones inside functions included) goes to its own layer or one below it, never up;
the table names every module; and no module imports another's private names."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minilms"
DOC = ROOT / "docs" / "architecture.md"


def documented_layers() -> list[tuple[str, list[str]]]:
    """``[(layer, [module path prefix, ...]), ...]`` bottom to top, from the table under
    "## The layers of the system": its first column names the layer, its second the paths."""
    text = DOC.read_text()
    section = text.split("## The layers of the system", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or set(cells[0]) <= {"-", " "} or cells[0] == "layer":
            continue
        paths = re.findall(r"`(minilms/[\w/]*(?:\.py)?)`", cells[1])
        if paths:
            rows.append((cells[0], paths))
    return rows


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def rank_of(module: str, layers) -> int | None:
    """The layer of ``module`` (dotted), by its longest documented path prefix."""
    best, best_len = None, -1
    for rank, (_, paths) in enumerate(layers):
        for path in paths:
            prefix = path.removesuffix(".py").removesuffix("/").replace("/", ".")
            hit = module == prefix or (path.endswith("/") and module.startswith(prefix + "."))
            if path == "minilms/__init__.py":
                hit = module == "minilms"
            if hit and len(prefix) > best_len:
                best, best_len = rank, len(prefix)
    return best


def imports(path: Path):
    """``(line, imported module, names)`` for every import of minilms in ``path``."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "minilms":
                    yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "minilms":
                continue
            names = [a.name for a in node.names]
            if node.module is None or (not node.level and target == "minilms"):
                for name in names:     # from . import x: x may be a module of its own
                    yield node.lineno, f"{target}.{name}", names
            else:
                yield node.lineno, target, names


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_table_lists_layers_bottom_to_top_and_covers_every_module():
    layers = documented_layers()
    assert len(layers) >= 10, "the table of layers in docs/architecture.md was not found"
    unplaced = [module_name(p) for p in MODULES if rank_of(module_name(p), layers) is None]
    assert not unplaced, f"modules in no documented layer: {unplaced}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_down_the_documented_layers(path):
    layers = documented_layers()
    mine = rank_of(module_name(path), layers)
    upward = []
    for line, target, _ in imports(path):
        rank = rank_of(target, layers)
        while rank is None and "." in target:     # from .x import name: the module is x
            target = target.rsplit(".", 1)[0]
            rank = rank_of(target, layers)
        if rank is not None and rank > mine:
            upward.append(f"line {line}: {target} ({layers[rank][0]}, above {layers[mine][0]})")
    assert not upward, f"{path.relative_to(ROOT)} imports up: {upward}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_name_is_imported_across_modules(path):
    private = [(line, target, name) for line, target, names in imports(path)
               for name in names if name.startswith("_") and not name.startswith("__")]
    assert not private, f"{path.relative_to(ROOT)} imports private names: {private}"


def test_no_library_module_imports_the_commands():
    layers = documented_layers()
    top = len(layers) - 1
    for path in MODULES:
        if rank_of(module_name(path), layers) == top:
            continue
        for line, target, _ in imports(path):
            assert not target.startswith("minilms.commands"), \
                f"{path.relative_to(ROOT)}:{line} imports {target}"


def test_the_checker_ranks_known_modules():
    """The checker itself: the LMS engine sits above the kernels, entry points at the top."""
    layers = documented_layers()
    kernels = rank_of("minilms.kernels.gemm", layers)
    assert rank_of("minilms.lms.planner", layers) > kernels
    assert rank_of("minilms.trace.__main__", layers) == len(layers) - 1
    assert rank_of("minilms.errors", layers) == 0
