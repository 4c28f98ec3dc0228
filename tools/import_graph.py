"""The package's import graph: circles, imports from a lower layer up, and the edges between layers.

    python tools/import_graph.py [ROOT]

reads every module of ROOT/keras_yolo_mgpu/ (default: this checkout) with
`ast`, nothing imported, and takes every import of a package module: at the
top of a module or inside a function, absolute or relative. It prints the
circles between modules, each import that goes from a lower layer of
`LAYERS` to a higher one (file and line), the modules no layer holds, and
the count of module-to-module edges per pair of layers; it exits with 1 when
it finds any of the first three. `tests/test_import_layers.py` runs the same
checks.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

PACKAGE = "keras_yolo_mgpu"

# Bottom to top: a module imports from its own layer (without a circle) and from the layers below,
# never from a layer above. One entry per package folder (or top-level module), relative to the package.
LAYERS = (
    # files written atomically, the C heap, progress displays, numbers in sentences, get_config, Keras internals,
    # model_data/, the backend switch
    (
        "base",
        (
            "__init__",
            "optional",
            "fileio",
            "heap",
            "progress",
            "wording",
            "serialization",
            "keras_compat",
            "resources",
            "backend",
        ),
    ),
    ("model", ("model",)),  # networks, loss, boxes, BatchNormalization, in keras.ops
    # annotation formats, the input pipeline; Darknet conversion, weight files; which outputs may be replaced
    ("data, weights", ("data", "weights", "outputs")),
    ("parallel", ("parallel",)),  # engines: how N devices run the model
    ("inference, plots", ("inference", "plots")),  # detector, video, export, exported formats; pictures
    ("evaluation", ("evaluation",)),  # mAP of weights or of an export
    ("training", ("training",)),  # the recipe, callbacks, checkpoints, the run folder
    ("bench, cli", ("bench", "cli")),  # benchmarks; the commands
    # python -m keras_yolo_mgpu.NAME; the commands as Python functions
    ("entry points", ("align", "check_dataset", "copy_scripts", "demo", "export", "bench.__main__", "api")),
)


class Import(NamedTuple):
    source: str  # importing module, relative to the package ("data.check")
    target: str  # imported module
    path: Path  # the importing file, relative to the root
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}"


def module_files(root: Path) -> dict[str, Path]:
    """Module name relative to the package ("data.check", "data" for data/__init__.py) -> its file."""
    package = root / PACKAGE
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _absolute(name: str | None, level: int, source: str, is_package: bool) -> str:
    """The absolute dotted name of `from <level dots><name> import ...` written in module `source`."""
    if not level:
        return name or ""
    base = [PACKAGE, *([] if source == "__init__" else source.split("."))]
    base = base[: len(base) - (level - 1) - (0 if is_package else 1)]
    return ".".join(base + ([name] if name else []))


def _relative(name: str, modules: dict[str, Path]) -> str | None:
    """`name` ("keras_yolo_mgpu.data.check.Problem") as the package module it reaches ("data.check"), or None."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    parts = name.split(".")[1:]
    while parts and ".".join(parts) not in modules:
        parts.pop()  # an attribute of a module, or a folder without __init__.py
    return ".".join(parts) if parts else "__init__"


def read_imports(root: str | Path) -> tuple[dict[str, Path], list[Import]]:
    """(the modules, every import of one package module by another) of the package under `root`."""
    root = Path(root)
    modules = module_files(root)
    found = []
    for source, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node.module, node.level, source, is_package)
                # `from a import b` reaches module a.b when there is one, else a's attribute b.
                names = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                target = _relative(name, modules)
                if target is not None and target != source:
                    found.append(Import(source, target, path.relative_to(root), node.lineno))
    return modules, found


def layer_of(module: str) -> int | None:
    """The index in `LAYERS` of the longest entry that `module` is or lies in; None when none does."""
    best, index = "", None
    for layer, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > len(best):
                best, index = entry, layer
    return index


def layer_name(index: int) -> str:
    return LAYERS[index][0]


def circles(imports: list[Import]) -> list[list[Import]]:
    """Each set of modules that import each other in a circle, as the imports that join its members."""
    edges: dict[str, set[str]] = {}
    for item in imports:
        edges.setdefault(item.source, set()).add(item.target)
    # Tarjan's strongly connected components (the package is a few hundred modules deep at most).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for child in sorted(edges.get(node, ())):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = set(stack[stack.index(node) :])
            del stack[stack.index(node) :]
            if len(component) > 1:
                components.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [
        sorted({i for i in imports if i.source in members and i.target in members}, key=lambda i: (i.source, i.line))
        for members in sorted(components, key=sorted)
    ]


def upward_imports(imports: list[Import]) -> list[Import]:
    """The imports from a module of a lower layer to one of a higher layer."""
    return [
        item
        for item in imports
        if None not in (layer_of(item.source), layer_of(item.target)) and layer_of(item.source) < layer_of(item.target)
    ]


def modules_without_layer(modules) -> list[str]:
    return [module for module in modules if layer_of(module) is None]


def layer_edges(imports: list[Import]) -> Counter:
    """(importing layer, imported layer) -> count of distinct module-to-module edges between different layers."""
    pairs = {(item.source, item.target) for item in imports}
    return Counter(
        (layer_of(source), layer_of(target))
        for source, target in pairs
        if None not in (layer_of(source), layer_of(target)) and layer_of(source) != layer_of(target)
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args(argv)

    modules, imports = read_imports(args.root)
    found_circles = circles(imports)
    print(f"{len(modules)} modules, {len({(i.source, i.target) for i in imports})} imports between them")
    print(f"\ncircles: {len(found_circles)}")
    for circle in found_circles:
        print("  " + " <-> ".join(sorted({i.source for i in circle})))
        for item in circle:
            print(f"    {item}")
    upward = upward_imports(imports)
    print(f"\nimports from a lower layer up: {len(upward)}")
    for item in upward:
        print(f"  {item} ({layer_name(layer_of(item.source))} -> {layer_name(layer_of(item.target))})")
    outside = modules_without_layer(modules)
    if outside:
        print(f"\nmodules in no layer of LAYERS: {', '.join(outside)}")
    print("\nedges between layers (importing -> imported: count):")
    for (source, target), count in sorted(layer_edges(imports).items(), reverse=True):
        print(f"  {layer_name(source):>16} -> {layer_name(target):<16} {count:3d}")
    return 1 if found_circles or upward or outside else 0


if __name__ == "__main__":
    sys.exit(main())
