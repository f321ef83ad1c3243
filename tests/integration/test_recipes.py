"""The README's recipes (and those of the docs it sends readers to) and the launch/ scripts' examples as a newcomer
runs them: each as written, in a copy of the checkout after `make demo`, from a shell without `make setup`'s
environment on PATH (nor Open MPI's variables that allow root: a recipe must say `--allow-run-as-root` itself). A
recipe that stops working fails here, and so does one that prints a warning. Then a bad input under each launcher the
README shows: one line, from rank 0 (the launcher's report names rank 0 as the first to fail, with exit status 2), the
last line with exit status 2 under the launch/ scripts, and the earlier run's files untouched. srun is left to the
SLURM tests (tests/system): a cluster is not started here.

Each command is launched once after the demo: `launched` starts them, each test waits for its own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.jobs import BIN, REPO, read_results
from support.launch import printed_command

LAUNCH = REPO / "launch"
# The files whose ```bash blocks are recipes; before each block: whether the test runs it, or why not.
RECIPE_FILES = ("README.md", "docs/setup.md", "docs/data.md", "docs/reference.md")
MARK = re.compile(r"^<!-- recipe: (?:(run)|not run: (.+)) -->$")
# The examples in the launch/ scripts' usage comments: `# Example: ...` runs here, `# Example on <what it needs>:
# ...` does not.
EXAMPLE = re.compile(r"^# Example(?: on ([^:]+))?: (.*)$")
RESULT_FILES = ("all_results.json", "project.json")  # a training run's, bench project's
# A line that warns: Python's warnings (FutureWarning: ...), Open MPI's and this project's `Warning:`/`warning:`,
# torch's C++ warnings ([W1126 11:37:28 ...]).
WARNING = re.compile(r"\w*warning\b:|^\[?W\d{4} ", re.IGNORECASE)
# What a launcher itself prints, not this project nor a library a rank calls: torchrun's agent says that it set
# OMP_NUM_THREADS=1 for each worker (a fresh shell has none set).
LAUNCHER_OWN = re.compile(r"^W\d{4} .* torch/distributed/run\.py:\d+\]")
DEMO_STEPS = "5"  # `make demo`'s run here: only the earlier run a recipe must not collide with


@dataclass(frozen=True)
class Recipe:
    where: str  # file:line
    text: str  # the shell text as written
    runs: bool
    needs: str  # why it does not run here


def doc_recipes() -> list[Recipe]:
    recipes = []
    for name in RECIPE_FILES:
        lines = (REPO / name).read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == "```bash":
                end = lines.index("```", i + 1)
                mark = MARK.match(lines[i - 1])
                runs, needs = (mark[1] is not None, mark[2] or "") if mark else (False, "")
                recipes.append(Recipe(f"{name}:{i + 1}", "\n".join(lines[i + 1 : end]), runs, needs if mark else "?"))
    return recipes


def commands(text: str) -> list[str]:
    """A recipe's command lines, each with its continuation lines joined."""
    return [" ".join(line.split()) for line in text.replace("\\\n", " ").splitlines() if line.strip()]


def launch_examples(readme: dict[str, str]) -> list[Recipe]:
    """The `# Example` lines of launch/; one the README or a docs file runs word for word (``readme``: their
    commands, where each is) is run there, not twice."""
    examples = []
    for script in sorted([*LAUNCH.rglob("*.sh"), *LAUNCH.rglob("*.sbatch")]):
        lines = script.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("# Example"):
                continue
            match = EXAMPLE.match(line)
            text = [match[2] if match else line]
            while text[-1].endswith("\\"):
                text.append(lines[i + len(text)].removeprefix("#"))
            where = f"{script.relative_to(REPO)}:{i + 1}"
            runs, needs = bool(match) and not match[1], (match[1] or "") if match else "?"
            in_readme = [readme.get(command) for command in commands("\n".join(text))]
            if runs and all(in_readme):
                runs, needs = False, f"run as {in_readme[0]}"
            examples.append(Recipe(where, "\n".join(text), runs, needs))
    return examples


DOC_RECIPES = doc_recipes()
RECIPES = [
    *DOC_RECIPES,
    *launch_examples({command: r.where for r in DOC_RECIPES if r.runs for command in commands(r.text)}),
]


def newcomer_env(cache_dir: Path) -> dict[str, str]:
    """A fresh shell's: `make setup`'s .venv/bin not on PATH, no PYTHONPATH or thread count, nothing of an enclosing
    job. Plus the tests' cache and the hub offline, and idle MPI ranks that yield (2 shared cores). Not Open MPI's
    OMPI_ALLOW_RUN_AS_ROOT: as root, a bare mpirun recipe runs only if it says `--allow-run-as-root` itself."""
    venv_bin = BIN.resolve()
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and Path(d).resolve() != venv_bin]
    dropped = ("PYTHONPATH", "OMP_NUM_THREADS", "VIRTUAL_ENV", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")
    job = ("SLURM_", "OMPI_", "PMIX_", "PMI_", "HOROVOD_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith(job)}
    env.update(PATH=os.pathsep.join(path), HOROVOD_TRAIN_CACHE=str(cache_dir), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMPI_MCA_mpi_yield_when_idle="1")  # fmt: skip
    return env


def run_shell(text: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``text`` as a script of its own, stdout and stderr in one stream (the order a terminal shows)."""
    return subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)  # fmt: skip


def warnings_in(output: str) -> list[str]:
    return [line for line in output.splitlines() if WARNING.search(line) and not LAUNCHER_OWN.match(line)]


@pytest.fixture(scope="module")
def after_demo(tmp_path_factory, cache_dir) -> Path:
    """A copy of the checkout's files (tracked, and new ones not ignored), `make setup`'s .venv linked in, after
    `make demo` (a short one: DEMO_ARGS; `-o setup`: the setup is the checkout's own, a copy must not reinstall
    into it)."""
    clone = tmp_path_factory.mktemp("checkout")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True, timeout=60).stdout  # fmt: skip
    for name in filter(None, listed.decode().split("\0")):
        source, copy = REPO / name, clone / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # configs/ -> horovod_train/configs
            copy.symlink_to(source.readlink())
        elif source.is_file():  # not a tracked file deleted in the working tree
            shutil.copy2(source, copy)
    (clone / ".venv").symlink_to(BIN.parent)
    demo = run_shell(f"make -o setup demo DEMO_ARGS='--max_steps {DEMO_STEPS}'", clone, newcomer_env(cache_dir), 600)
    assert demo.returncode == 0, demo.stdout[-4000:]
    assert read_results(clone / "runs" / "demo")["world_size"] == 2
    assert not warnings_in(demo.stdout), demo.stdout[-4000:]
    return clone


def without_own_output_dir(command: str) -> str:
    return re.sub(r" --(max_steps|output_dir) \S+", "", command)


# The README's runs of the demo job without their own --output_dir (nor --max_steps): they write where `make demo`
# did, which the run refuses. By program: launch/horovodrun_local.sh, launch/mpirun.sh, torchrun. Not the bare
# horovodrun and mpirun these two scripts run: the ranks do the same under them, the scripts add the last line.
THROUGH_SCRIPTS = {"horovodrun": "horovodrun_local.sh", "mpirun": "mpirun.sh"}
BAD_INPUT = {
    Path(command.split()[0]).name: without_own_output_dir(command)
    for recipe in DOC_RECIPES
    if recipe.runs
    for command in commands(recipe.text)
    if "--config configs/demo.yaml" in command
    and "--output_dir" in command
    and Path(command.split()[0]).name not in THROUGH_SCRIPTS
}
REFUSED = (
    "error: --output_dir runs/demo already holds files of an earlier run; fix: pass --overwrite_output_dir to "
    "replace them, or choose another --output_dir"
)
# How each launcher names the first rank that failed, and its exit status: horovodrun, mpirun, torchrun.
FIRST_FAILED = [
    re.compile(r"first process to do so was:\s+Process name: (\d+)\s+Exit code: (\d+)"),
    re.compile(r"first process to do so was:\s+Process name: \[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(\d+)"),
    re.compile(r"Root Cause \(first observed failure\):.*?rank\s*: (\d+) .*?exitcode\s*: (\d+)", re.DOTALL),
]


@dataclass(frozen=True)
class Refused:
    proc: subprocess.CompletedProcess
    demo: Path  # the earlier run's directory the launch was refused
    before: dict[str, tuple[int, int]]  # its files before the launch


def files_of(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*")}


def refuse(command: str, checkout: Path, env: dict[str, str]) -> Refused:
    demo = checkout / "runs" / "demo"
    before = files_of(demo)
    return Refused(run_shell(command, checkout, env, timeout=300), demo, before)


def selected(request: pytest.FixtureRequest, parameter: str) -> list:
    """The values of ``parameter`` of this module's tests that this session runs, in their order."""
    values = []
    for item in request.session.items:
        params = item.callspec.params if item.module is request.module and hasattr(item, "callspec") else {}
        if parameter in params and params[parameter] not in values:
            values.append(params[parameter])
    return values


@pytest.fixture(scope="module")
def launched(request, after_demo, cache_dir, tmp_path_factory) -> Iterator[dict[str, Future]]:
    """The runnable recipes in the checkout after `make demo`, and the bad inputs, each in a copy of that checkout
    of its own (a run takes its --output_dir's lock before it judges the directory: two refused at once in the
    same one would be told "in use by another job"): those this session tests, by recipe and by program, one at
    a time in the background. Not all at once: on 2 shared cores that gained nothing (a launch is CPU-bound, 4 min
    for the module either way), and under that load a refused mpirun.sh run once printed its line other than once."""
    env = newcomer_env(cache_dir)
    recipes, programs = selected(request, "recipe"), selected(request, "program")
    checkouts = {}
    for program in programs:  # copied before the recipes write into the checkout
        checkouts[program] = tmp_path_factory.mktemp(f"bad-input-{program}")
        shutil.copytree(after_demo, checkouts[program], symlinks=True, dirs_exist_ok=True)
    with ThreadPoolExecutor(max_workers=1) as pool:
        futures = {r.where: pool.submit(run_shell, r.text, after_demo, env, 540) for r in recipes}
        for program in programs:
            futures[program] = pool.submit(refuse, BAD_INPUT[program], checkouts[program], env)
        yield futures


def test_every_readme_recipe_and_launch_example_says_whether_it_runs_here() -> None:
    unmarked = [r.where for r in RECIPES if not r.runs and r.needs == "?"]
    how = "README, docs: <!-- recipe: run --> or <!-- recipe: not run: WHY --> before it; launch/: # Example[ on WHAT]:"
    assert not unmarked, f"say whether these run here ({how}): {unmarked}"
    run = [r for r in RECIPES if r.runs or r.needs.startswith("run as ")]
    assert len(run) >= 6, RECIPES  # the README's horovodrun, mpirun, launch/, torchrun ones, launch/'s example
    assert set(BAD_INPUT) >= {*THROUGH_SCRIPTS.values(), "torchrun"}, BAD_INPUT


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [r for r in RECIPES if r.runs], ids=lambda r: r.where)
def test_a_recipe_runs_as_written_after_make_demo_and_warns_of_nothing(recipe, after_demo, launched, cache_dir) -> None:
    proc = launched[recipe.where].result()
    assert proc.returncode == 0, f"{recipe.where}: exit {proc.returncode}\n{proc.stdout[-4000:]}"
    outputs = re.findall(r"--output_dir\s+(\S+)", recipe.text)
    assert outputs, f"{recipe.where} names no --output_dir of its own: it would write where make demo did"
    for output in map(after_demo.joinpath, outputs):
        written = [name for name in RESULT_FILES if (output / name).is_file()]
        assert written, f"{recipe.where}: nothing written in {output}\n{proc.stdout[-3000:]}"
        if written == ["all_results.json"]:
            assert read_results(output)["world_size"] == 2
    assert not warnings_in(proc.stdout), f"{recipe.where} warned:\n" + "\n".join(warnings_in(proc.stdout))
    # What a launch/ script prints to run runs as printed from this shell: its programs found without .venv/bin.
    for program in ("horovodrun", "mpirun"):
        if re.search(rf"^\+ \S*{program} ", proc.stdout, re.MULTILINE):
            printed = printed_command(proc.stdout, program).split()[1]
            path = newcomer_env(cache_dir)["PATH"]
            assert shutil.which(printed, path=path), f"{recipe.where} printed {printed}, not on PATH"


def first_failed(output: str) -> tuple[int, int] | None:
    """(rank, exit status) of the first rank that failed, as the launcher's report names it."""
    for pattern in FIRST_FAILED:
        if match := pattern.search(output):
            return int(match[1]), int(match[2])
    return None


@pytest.mark.slow
@pytest.mark.parametrize("program", BAD_INPUT)
def test_bad_input_is_one_line_from_rank_0_and_the_launch_scripts_end_with_it(program, launched) -> None:
    refused = launched[program].result()
    output = refused.proc.stdout
    detail = f"exit {refused.proc.returncode}\n{output[-4000:]}"
    errors = [line for line in output.splitlines() if "error: " in line and "; fix: " in line]
    assert len(errors) == 1 and errors[0].endswith(REFUSED), detail
    assert first_failed(output) == (0, 2), detail  # rank 0 said it; the others waited for the launcher's end
    if program.endswith(".sh"):  # a launch/ script
        assert refused.proc.returncode == 2 and output.splitlines()[-1] == REFUSED, detail
    else:
        assert refused.proc.returncode != 0, detail
    assert files_of(refused.demo) == refused.before
