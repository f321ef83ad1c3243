"""The package's shape, kept: short functions and classes, a loop with no engine-specific branch, no import
cycle, three products with one-way boundaries, and a layout in docs/design.md that lists every module."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from support.imports import imported_modules
from support.jobs import REPO

PACKAGE = REPO / "horovod_train"
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 400
# The products beside the training library (the core): each may import the core, never the other way.
PRODUCTS = ("horovod_train.bench", "horovod_train.gpucheck")
ENTRY_POINTS = {"horovod_train.cli.main", "horovod_train.__main__"}  # the command line: offers `bench` too
# One-way boundaries inside the core: the task shapes are asked by the data, the model, the evaluation and the
# outputs, and ask none of them (nor the configuration, whose fields they read; they read the datasets' catalogs:
# GLUE's tasks and synthetic-nli's labels); the data knows nothing of the model, the training or the metrics.
DATA_PIPELINE = tuple(f"horovod_train.data.{name}" for name in ("sources", "columns", "labels", "splits", "tokenize",
                                                                "loaders"))  # fmt: skip
NEVER_IMPORTS = {
    "horovod_train.tasks": ("horovod_train.config.run_config", *DATA_PIPELINE, "horovod_train.models",
                            "horovod_train.outputs.transformers_files", "horovod_train.training"),
    "horovod_train.data": ("horovod_train.models", "horovod_train.training"),
}  # fmt: skip
ASK_THE_SHAPES = ("horovod_train.data.labels", "horovod_train.data.loaders", "horovod_train.models.model",
                  "horovod_train.training.evaluation", "horovod_train.outputs.transformers_files")  # fmt: skip


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def test_no_function_is_longer_than_60_lines():
    long = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


def long_classes() -> dict[str, int]:
    return {
        f"{path.relative_to(REPO)}:{node.name}": node.end_lineno - node.lineno + 1
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    }


def test_no_class_is_longer_than_400_lines():
    assert not long_classes(), long_classes()


def elastic_horovod(module: str) -> bool:
    """Horovod's elastic API (horovod.torch.elastic, ...) or the engine's use of it (engines/horovod/elastic.py)."""
    return module.split(".")[0] in ("horovod", "horovod_train") and "elastic" in module.split(".")


def test_the_loop_the_cli_and_the_file_helpers_import_nothing_of_elastic_horovod():
    """They reach it only through the engine table (--elastic is the Horovod engine's policy)."""
    for name in (
        "training/trainer.py",
        "cli/main.py",
        "common/files.py",
    ):  # training/: test_trainer_shape.py, no backend at all
        assert not {m for m in imported_modules(PACKAGE / name) if elastic_horovod(m)}, name


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Package modules ``path`` imports anywhere in it (support/imports.py)."""
    return imported_modules(path) & known


def test_no_import_cycle():
    found = modules()
    graph = {name: imports_of(path, set(found)) - {name} for name, path in found.items()}
    # A package imports its __init__'s own imports; a module importing its parent package is not a cycle.
    graph = {name: {dep for dep in deps if not name.startswith(f"{dep}.")} for name, deps in graph.items()}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in visiting:
            raise AssertionError("import cycle: " + " -> ".join([*visiting[visiting.index(name) :], name]))
        if name in done:
            return
        visiting.append(name)
        for dep in sorted(graph[name]):
            visit(dep)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def product_of(module: str) -> str:
    return next((p for p in PRODUCTS if module == p or module.startswith(f"{p}.")), "core")


def test_the_core_library_imports_neither_bench_nor_the_gpu_check():
    found = modules()
    crossing = {
        name: sorted(dep for dep in imports_of(path, set(found)) if product_of(dep) != "core")
        for name, path in found.items()
        if product_of(name) == "core" and name not in ENTRY_POINTS
    }
    assert not {name: deps for name, deps in crossing.items() if deps}


def test_each_product_imports_only_the_core_and_itself():
    """The core below its command line: the command line offers the products, which never reach back up to it."""
    found = modules()
    for name, path in found.items():
        product = product_of(name)
        if product != "core":
            imported = imports_of(path, set(found))
            others = {dep for dep in imported if product_of(dep) not in ("core", product) or dep in ENTRY_POINTS}
            assert not others, (name, others)


def inside(module: str, parts: tuple[str, ...]) -> bool:
    return any(module == part or module.startswith(f"{part}.") for part in parts)


def test_the_task_shapes_and_the_data_import_one_way():
    found = modules()
    crossing = {
        name: sorted(dep for dep in imports_of(path, set(found)) if inside(dep, forbidden))
        for part, forbidden in NEVER_IMPORTS.items()
        for name, path in found.items()
        if inside(name, (part,))
    }
    assert not {name: deps for name, deps in crossing.items() if deps}


def test_the_data_model_evaluation_and_outputs_ask_the_task_shapes():
    found = modules()
    asking = {name: any(inside(dep, ("horovod_train.tasks",)) for dep in imports_of(found[name], set(found)))
              for name in ASK_THE_SHAPES}  # fmt: skip
    assert all(asking.values()), asking


def third_party_imports(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            tops.add(node.module.split(".")[0])
    return tops - set(sys.stdlib_module_names) - {"horovod_train"}


# The programs the GPU check's steps run in their own processes, after the dependencies are installed: they may
# import torch, Horovod and transformers (and the core), the check itself never imports them.
GPU_CHECK_STEP_PROGRAMS = {"horovod_train.gpucheck.node"}
# The core modules the check reads for their tables alone (the engine rows, a run's file names): what importing them
# runs counts, not their functions (which import the engines and torch), which the check never calls;
# test_gpu_check.py's check planned by a python that has only its standard library shows it.
GPU_CHECK_READS_TABLES = {"horovod_train.engines.specs", "horovod_train.outputs.run_directory"}


def test_the_gpu_check_imports_only_the_standard_library():
    """It starts before the node's dependencies are installed: no module it reaches may import one. Its step
    programs run as subprocesses (python -m), never imported by it."""
    found = modules()
    check = [name for name in found if product_of(name) == "horovod_train.gpucheck"]
    reached, todo = set(), [name for name in check if name not in GPU_CHECK_STEP_PROGRAMS]
    tables, read = set(), []
    while todo:
        name = todo.pop()
        if name in GPU_CHECK_READS_TABLES:
            read.append(name)
        elif name not in reached:
            reached.add(name)
            todo += imports_of(found[name], set(found))
    while read:  # the tables: what importing them runs
        name = read.pop()
        if name not in tables:
            tables.add(name)
            read += imported_modules(found[name], at_import=True) & set(found)
    assert not (reached | tables) & GPU_CHECK_STEP_PROGRAMS
    assert {name: third_party_imports(found[name]) for name in reached if third_party_imports(found[name])} == {}
    outside = {name: tops for name in tables if (tops := tops_at_import(found[name]) - STANDARD_OR_OURS)}
    assert outside == {}
    assert set(check) >= GPU_CHECK_STEP_PROGRAMS  # the exemption names real modules
    assert tables >= GPU_CHECK_READS_TABLES  # and the check reads those tables


STANDARD_OR_OURS = {*sys.stdlib_module_names, "horovod_train"}


HUB_MODEL_OR_DATA = ("transformers", "huggingface_hub", "datasets", "horovod_train.models.model")


def test_the_argument_checks_do_no_io_and_read_registries_cheap_to_import():
    """domains.py checks values: it reads no model or tokenizer configuration (model.fit_max_seq_length does, where
    the run starts building), and the registries it and the engine rows read (the schedules, the trackers, GLUE's
    tasks, the engines' options) import neither torch nor transformers: the CLI parses its arguments before either
    is needed, and a batch script and launch/k8s/render.py read the engine rows (engines/specs.py) before a job."""
    found = modules()
    direct = imported_modules(found["horovod_train.config.domains"])
    assert not {name for name in direct if f"{name}.".startswith(tuple(f"{m}." for m in HUB_MODEL_OR_DATA))}
    reached, todo = set(), ["horovod_train.config.domains", "horovod_train.engines.specs"]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += imported_modules(found[name], at_import=True) & set(found)
    heavy = {name: tops for name in reached if (tops := tops_at_import(found[name]) & {"torch", "transformers"})}
    assert heavy == {}


def tops_at_import(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(path, at_import=True)}


def design_layout() -> set[str]:
    """The paths of modules the layout block of docs/design.md names, relative to the package."""
    design = (REPO / "docs" / "design.md").read_text().split("## Layout", 1)[1]
    block = design.split("```\nhorovod_train/\n", 1)[1].split("```", 1)[0]
    listed, folders = set(), []  # folders: (indent, path) of the folders the lines below sit in
    for line in block.splitlines():
        if not line.strip() or line.strip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        names, _, description = line.strip().partition("  ")  # the names' column, then what they are
        while folders and folders[-1][0] >= indent:
            folders.pop()
        here = folders[-1][1] if folders else ""
        if names.endswith("/"):  # a folder: the lines below it, and the files its description names
            here += names
            folders.append((indent, here))
            names = description
        listed |= {here + name for name in re.findall(r"(?<![\w./`])((?:\w+/)*\w+\.py)\b", names)}
    return listed


def test_the_design_layout_lists_every_module_and_only_those():
    exists = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")}
    required = {name for name in exists if not name.endswith("__init__.py")}  # a package is shown by its folder
    listed = design_layout()
    assert not required - listed, f"docs/design.md's layout block misses {sorted(required - listed)}"
    assert not listed - exists, f"docs/design.md's layout block names {sorted(listed - exists)}, which do not exist"
