"""One source of launch knowledge (horovod_train/launching/): the exact command lines its launchers write, the
command line the launch/ scripts read from it, and no second copy of an mpirun flag list or of the rank variables
anywhere in the repository's .py and .sh files."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.jobs import REPO

from horovod_train.errors import UsageError
from horovod_train.launching import LAUNCHERS, open_mpi, signalled_rank_variables, srun

SOURCE = REPO / "horovod_train" / "launching"
mpirun_command = LAUNCHERS["mpirun"].command
horovodrun_command = LAUNCHERS["horovodrun"].command
torchrun_command = LAUNCHERS["torchrun"].command
srun_command = LAUNCHERS["srun"].command

THIS = Path(__file__).resolve()

DOCUMENTED = ["-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib"]

NO_OFI = ["-gmca", "btl", "^openib,ofi"]

PROGRAM = ["/opt/my env/bin/python", "-m", "horovod_train", "train", "--output_dir", "runs/a b"]


def test_mpirun_command_exact_argv_not_root() -> None:
    env = {"PATH": "/bin", "HOROVOD_FUSION_THRESHOLD": "1", "HF_HOME": "/hf", "HOME": "/root", "HF_TOKEN_PATH": "/t"}
    assert mpirun_command(PROGRAM, 2, env=env, root=False) == [
        "mpirun", "-np", "2", *DOCUMENTED, *NO_OFI,
        "-x", "PATH", "-x", "HF_HOME", "-x", "HF_TOKEN_PATH", "-x", "HOROVOD_FUSION_THRESHOLD", *PROGRAM,
    ]  # fmt: skip


def test_mpirun_command_as_root_on_hosts_with_ssh_and_interfaces() -> None:
    env = {"PATH": "/bin", "NCCL_DEBUG": "INFO", "LD_LIBRARY_PATH": "/lib64", "OMP_NUM_THREADS": "1"}
    command = mpirun_command(
        PROGRAM, 4, env=env, hosts="a:2,b:2", forward=["MY_VAR", "OTHER=1"], network_interfaces="eth0",
        ssh_port=2222, ssh_identity_file="/keys/id", oversubscribe=True, yield_when_idle=True, root=True,
    )  # fmt: skip
    assert command == [
        "mpirun", "--allow-run-as-root", "-np", "4", "-H", "a:2,b:2", *DOCUMENTED, *NO_OFI,
        "-mca", "btl_tcp_if_include", "eth0", "-mca", "oob_tcp_if_include", "eth0",
        "--oversubscribe", "-mca", "mpi_yield_when_idle", "1", "-mca", "plm_rsh_args", "-p 2222 -i /keys/id",
        "-x", "MY_VAR", "-x", "OTHER=1", "-x", "NCCL_DEBUG", "-x", "PATH", "-x", "LD_LIBRARY_PATH",
        "-x", "OMP_NUM_THREADS", *PROGRAM,
    ]  # fmt: skip


@pytest.mark.parametrize(("euid", "expected"), [(0, True), (1000, False)])
def test_allow_run_as_root_follows_the_effective_user(monkeypatch, euid: int, expected: bool) -> None:
    monkeypatch.setattr(open_mpi.os, "geteuid", lambda: euid)
    assert ("--allow-run-as-root" in mpirun_command(["x"], 2, env={})) == expected


def test_the_ofi_exclusion_is_on_every_mpirun_and_off_only_on_request() -> None:
    assert open_mpi.mpirun_flags() == [*DOCUMENTED, *NO_OFI]
    assert open_mpi.mpirun_flags(exclude_ofi=False) == DOCUMENTED
    assert mpirun_command(["x"], 2, env={}, root=False, exclude_ofi=False) == ["mpirun", "-np", "2", *DOCUMENTED,
                                                                                "-x", "PATH", "x"]  # fmt: skip


def test_horovodrun_command_exact_argv() -> None:
    assert horovodrun_command(PROGRAM, 2) == ["horovodrun", "-np", "2", "--gloo", *PROGRAM]
    knobs = ["--fusion-threshold-mb", "32", "--timeline-filename", "/tmp/a b.json"]
    assert horovodrun_command(
        PROGRAM, 8, controller="mpi", hosts="n1:4,n2:4", ssh_port=12345, ssh_identity_file="/k", options=knobs
    ) == [
        "horovodrun", "-np", "8", "-H", "n1:4,n2:4", "--ssh-port", "12345", "--ssh-identity-file", "/k", "--mpi",
        *knobs, "--mpi-args=-gmca btl ^openib,ofi", *PROGRAM,
    ]  # fmt: skip


def test_horovodrun_refuses_an_unknown_controller() -> None:
    with pytest.raises(UsageError, match="neither gloo nor mpi"):
        horovodrun_command(PROGRAM, 2, controller="nccl")


def test_torchrun_command_exact_argv() -> None:
    assert torchrun_command(PROGRAM, 2, executable="/v/bin/torchrun") == [
        "/v/bin/torchrun", "--standalone", "--nproc_per_node", "2", "--no-python", *PROGRAM,
    ]  # fmt: skip
    module = ["-m", "horovod_train", "train", "--engine", "ddp"]
    assert torchrun_command(module, 4, nnodes=2, rdzv_id="77", rdzv_endpoint="node1:29500") == [
        "torchrun", "--nnodes", "2", "--nproc_per_node", "4", "--rdzv_id", "77", "--rdzv_backend", "c10d",
        "--rdzv_endpoint", "node1:29500", *module,
    ]  # fmt: skip


def test_srun_command_exact_argv() -> None:
    assert srun_command(PROGRAM, mpi="pmix") == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", *PROGRAM]
    assert srun_command(["torchrun"], 2, ntasks_per_node=1, cpus_per_task=8) == [
        "srun", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=8", "--kill-on-bad-exit=1", "torchrun",
    ]  # fmt: skip
    assert srun_command(["bash"], 2, overlap=True, nodes=2, ntasks_per_node=1) == [
        "srun", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash",
    ]  # fmt: skip


def test_signalled_rank_variables() -> None:
    """A stop signal goes to processes with these (SLURM_PROCID: every srun task has it, launchers too)."""
    assert signalled_rank_variables() == [
        "LOCAL_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
    ]  # fmt: skip


MPI_FLAG_PATTERNS = {
    "--bind-to": re.compile(r"(?<![\w-])--?bind-to\b"),
    "--map-by": re.compile(r"(?<![\w-])--?map-by\b"),
    "an MCA parameter (-mca/--mca/-gmca NAME)": re.compile(r"(?<![\w-])--?g?mca\s+\w"),
    "--allow-run-as-root": re.compile(r"--allow-run-as-root"),
    "-x forwarding": re.compile(r"(?<![\w-])-x\s+[A-Z_][A-Z0-9_]*\b"),
}

RANK_NAMES = sorted(
    {row.variables.rank for row in LAUNCHERS.values() if row.variables} | {srun.RANK, *srun.PMI_RANK_VARIABLES}
)

RANK_NAME = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(RANK_NAMES) + r")(?![A-Za-z0-9_])")

SKIPPED_DIRS = {"__pycache__", "build", "dist", "node_modules"}


def repo_files() -> Iterator[Path]:
    for path in REPO.rglob("*"):
        parts = path.relative_to(REPO).parts
        if any(part.startswith(".") or part in SKIPPED_DIRS or part.endswith(".egg-info") for part in parts):
            continue
        if (
            path.suffix in (".py", ".sh", ".sbatch")
            and path.is_file()
            and SOURCE not in path.resolve().parents
            and path.resolve() != THIS
        ):
            yield path


def _strings(node: ast.AST) -> list[str]:
    """The string constants of a statement's own expressions (not of the statements nested in it), in order;
    not a dict's keys: {"PMIX_RANK": "0"} is an environment a test sets, not a list of names."""
    found: list[str] = []
    keys = {id(key) for key in node.keys if key is not None} if isinstance(node, ast.Dict) else set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt) or id(child) in keys:
            continue
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            found.append(child.value)
        else:
            found += _strings(child)
    return found


def python_statements(text: str, is_test_module: bool) -> Iterator[tuple[int, str]]:
    """(line, its string constants joined by spaces) for each statement, without docstrings, and without the
    assertions of test modules (they check what a launch printed)."""
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.stmt) or (is_test_module and isinstance(node, ast.Assert)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        yield node.lineno, " ".join(_strings(node))


def shell_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line, code) for each command line (continuations joined), comments left out."""
    logical, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not logical and line.lstrip().startswith("#"):
            continue
        start = start or number
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        yield start, logical + line
        logical, start = "", 0


def knowledge_copies(path: Path, text: str) -> list[str]:
    is_python = path.suffix == ".py"
    units = python_statements(text, path.name.startswith("test_")) if is_python else shell_lines(text)
    copies = []
    for line, code in units:
        copies += [f"{path}:{line}: {what}" for what, pattern in MPI_FLAG_PATTERNS.items() if pattern.search(code)]
        names = sorted(set(RANK_NAME.findall(code)))
        if len(names) >= 2:
            copies.append(f"{path}:{line}: rank variables {', '.join(names)}")
    return copies


def test_launch_knowledge_has_one_source() -> None:
    copies = [copy for path in repo_files() for copy in knowledge_copies(path.relative_to(REPO), path.read_text())]
    assert not copies, "use horovod_train/launching/ instead:\n" + "\n".join(copies)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("conftest.py", 'def mpirun():\n    return ["mpirun", "-x", "PATH", "--mca", "btl", "self,tcp"]\n'),
        ("launchers.py", 'LOCAL = ["--oversubscribe", "-mca", "mpi_yield_when_idle", "1"]\n'),
        ("x.py", 'ROOT = ["--allow-run-as-root"] if os.geteuid() == 0 else []\n'),
        ("x.py", 'V = {"horovodrun": "HOROVOD_RANK",\n     "mpirun": "OMPI_COMM_WORLD_RANK"}\n'),
        ("test_x.py", 'documented = ["-bind-to none -map-by slot"]\n'),
        ("mpirun.sh", "exports+=(-x NCCL_DEBUG -x PATH)\n"),
        ("lib.sh", "HVT_MPI_BTL_OVERRIDE=(-gmca btl '^openib,ofi')\n"),
        ("common.sh", "grep -qE '^(HOROVOD_RANK|PMIX_RANK|PMI_RANK)=' <<<\"$environ\" || continue\n"),
        ("run.sbatch", "mpirun -np 2 \\\n    -map-by slot prog\n"),
    ],
)
def test_a_copy_is_found(name: str, text: str) -> None:
    assert knowledge_copies(Path(name), text)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("test_x.py", 'def test():\n    assert "-mca pml ob1 -x PATH" in command\n'),
        ("x.py", '"""Run with -bind-to none and -x PATH."""\n'),
        ("x.sh", "# mpirun -bind-to none -x PATH, HOROVOD_RANK or PMI_RANK\n"),
        ("x.py", 'env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}\n'),
        ("x.py", 'proc = run(["shellcheck", "-x", *SCRIPTS])\n'),
        ("test_x.py", 'CASES = {"rank": {"PMIX_RANK": "0"},\n         "mpirun": {"OMPI_COMM_WORLD_RANK": "0"}}\n'),
    ],
)
def test_what_is_not_a_copy(name: str, text: str) -> None:
    assert not knowledge_copies(Path(name), text)
