"""The README's recipes and the launch/ scripts' examples as a newcomer runs them: each as written, in a copy of the
checkout after `make demo`, from a shell without `make setup`'s environment on PATH. A recipe that stops working
fails here, and so does one that prints a warning. Then a bad input under each launcher the README shows: one line,
from rank 0 (before the launcher's own report of the failed rank under bare horovodrun, mpirun and torchrun; the
last line, with exit status 2, under the launch/ scripts), and the earlier run's files untouched. srun is left to
the SLURM tests (tests/system): a cluster is not started here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.jobs import BIN, REPO, read_results
from support.launch import printed_command

LAUNCH = REPO / "launch"
# Before each ```bash block of README.md: whether the test runs it, or why not.
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


def readme_recipes() -> list[Recipe]:
    lines = (REPO / "README.md").read_text().splitlines()
    recipes = []
    for i, line in enumerate(lines):
        if line.strip() == "```bash":
            end = lines.index("```", i + 1)
            mark = MARK.match(lines[i - 1])
            runs, needs = (mark[1] is not None, mark[2] or "") if mark else (False, "")
            recipes.append(Recipe(f"README.md:{i + 1}", "\n".join(lines[i + 1 : end]), runs, needs if mark else "?"))
    return recipes


def launch_examples() -> list[Recipe]:
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
            examples.append(Recipe(where, "\n".join(text), bool(match) and not match[1], match[1] if match else "?"))
    return examples


RECIPES = [*readme_recipes(), *launch_examples()]


def newcomer_env(cache_dir: Path) -> dict[str, str]:
    """A fresh shell's: `make setup`'s .venv/bin not on PATH, no PYTHONPATH or thread count, nothing of an enclosing
    job. Plus the tests' cache and the hub offline, idle MPI ranks that yield (2 shared cores), and as root the
    README's `--allow-run-as-root` for its mpirun."""
    venv_bin = BIN.resolve()
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and Path(d).resolve() != venv_bin]
    dropped = ("PYTHONPATH", "OMP_NUM_THREADS", "VIRTUAL_ENV", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")
    job = ("SLURM_", "OMPI_", "PMIX_", "PMI_", "HOROVOD_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith(job)}
    env.update(PATH=os.pathsep.join(path), HOROVOD_TRAIN_CACHE=str(cache_dir), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMPI_MCA_mpi_yield_when_idle="1")  # fmt: skip
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
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


def test_every_readme_recipe_and_launch_example_says_whether_it_runs_here() -> None:
    unmarked = [r.where for r in RECIPES if not r.runs and r.needs == "?"]
    how = "README: <!-- recipe: run --> or <!-- recipe: not run: WHY --> before it; launch/: # Example[ on WHAT]:"
    assert not unmarked, f"say whether these run here ({how}): {unmarked}"
    assert sum(r.runs for r in RECIPES) >= 6, RECIPES  # the README's horovodrun, mpirun, launch/, torchrun ones


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [r for r in RECIPES if r.runs], ids=lambda r: r.where)
def test_a_recipe_runs_as_written_after_make_demo_and_warns_of_nothing(recipe, after_demo, cache_dir) -> None:
    env = newcomer_env(cache_dir)
    proc = run_shell(recipe.text, after_demo, env, timeout=540)
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
            assert shutil.which(printed, path=env["PATH"]), f"{recipe.where} printed {printed}, not on PATH"


def commands(text: str) -> list[str]:
    """A recipe's command lines, each with its continuation lines joined."""
    return [" ".join(line.split()) for line in text.replace("\\\n", " ").splitlines() if line.strip()]


def without_own_output_dir(command: str) -> str:
    return re.sub(r" --(max_steps|output_dir) \S+", "", command)


# The README's runs of the demo job without their own --output_dir (nor --max_steps): they write where `make demo`
# did, which the run refuses. By launcher: horovodrun, mpirun, torchrun, launch/horovodrun_local.sh, ...
BAD_INPUT = {
    Path(command.split()[0]).name: without_own_output_dir(command)
    for recipe in readme_recipes()
    if recipe.runs
    for command in commands(recipe.text)
    if "--config configs/demo.yaml" in command and "--output_dir" in command
}
REFUSED = (
    "error: --output_dir runs/demo already holds files of an earlier run; fix: pass --overwrite_output_dir to "
    "replace them, or choose another --output_dir"
)


def files_of(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*")}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", BAD_INPUT)
def test_bad_input_is_one_line_from_rank_0_and_the_launch_scripts_end_with_it(launcher, after_demo, cache_dir) -> None:
    demo = after_demo / "runs" / "demo"
    before = files_of(demo)
    proc = run_shell(BAD_INPUT[launcher], after_demo, newcomer_env(cache_dir), timeout=300)
    errors = [line for line in proc.stdout.splitlines() if "error: " in line and "; fix: " in line]
    assert len(errors) == 1 and errors[0].endswith(REFUSED), f"exit {proc.returncode}\n{proc.stdout[-4000:]}"
    if launcher == "horovodrun":  # the one launcher that tags each line with its rank
        assert errors[0] == f"[0]<stderr>:{REFUSED}", errors
    if launcher.endswith(".sh"):  # a launch/ script
        assert proc.returncode == 2 and proc.stdout.splitlines()[-1] == REFUSED, proc.stdout[-4000:]
    else:
        assert proc.returncode != 0, proc.stdout[-4000:]
    assert files_of(demo) == before
