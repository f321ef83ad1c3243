"""Bad input as real programs: a one-line error naming the problem and the fix, exit code 2, and nothing written
(every case of support/bad_input.py also runs in-process in tests/unit/test_bad_input.py). An earlier run's
files are refused in this process: test_recipes refuses them as a program under every launcher of the README."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from support.bad_input import CASES, _small_vocab_model, assert_one_line, assert_refused, snapshot
from support.data_files import bad_data
from support.jobs import BIN, REPO, base_env, run, train_cmd, train_here

from horovod_train.launching import LAUNCHERS
from horovod_train.launching.base import free_port
from horovod_train.outputs.run_directory import record

# A case of each kind, as a real program: refused while the arguments are read, while the data is read (after the
# engine started), while the run directory is claimed, while the model is built. Every case runs in-process in
# tests/unit/test_bad_input.py.
AS_PROGRAMS = ["unknown engine", "csv without nli columns", "missing checkpoint", "tokenizer/model mismatch"]


@pytest.mark.parametrize("case", AS_PROGRAMS)
def test_bad_input_is_refused_and_nothing_is_written(case, tmp_path, cache_dir):
    args, expected = CASES[case](tmp_path)
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    # --engine single keeps these fast; a later --engine in args wins.
    proc = run(train_cmd("--engine", "single", "--output_dir", str(out), *args), cache_dir, timeout=120)
    assert_refused(proc, expected)
    assert not out.exists()
    assert snapshot(tmp_path) == before


def test_model_smaller_than_its_tokenizer_is_refused(tmp_path, cache_dir):
    """In this process: refusals while the model is built run as a program in the tokenizer/model mismatch case."""
    model = _small_vocab_model(tmp_path)
    before = snapshot(tmp_path)
    proc = train_here(
        cache_dir,
        "--engine",
        "single",
        "--model_name_or_path",
        str(model),
        "--tokenizer_name",
        "tiny-bert",
        "--synthetic_num_examples",
        "300",
        "--output_dir",
        str(tmp_path / "out"),
    )
    assert_refused(proc, "embeds only 50")
    assert snapshot(tmp_path) == before


LAUNCH_CASES = {
    "hostfile with a bad line": (
        ["launch/horovodrun_multihost.sh", "--hostfile", "{hostfile}", "-np", "2"],
        "is not 'host slots=N'",
    ),
    "-np above the hosts' slots": (["launch/horovodrun_multihost.sh", "-H", "a:1,b:1", "-np", "4"], "more than"),
    "fusion threshold not a number": (
        ["launch/horovodrun_local.sh", "-np", "2", "--fusion-threshold-mb", "lots"],
        "--fusion-threshold-mb",
    ),
}


@pytest.mark.parametrize("case", list(LAUNCH_CASES))
def test_bad_launch_input_is_refused_before_launching(case, tmp_path, cache_dir):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnode2 slots=two\n")
    argv, expected = LAUNCH_CASES[case]
    argv = [a.format(hostfile=hostfile) for a in argv]
    before = snapshot(tmp_path)
    proc = run(["bash", *argv, "--", "--output_dir", str(tmp_path / "out")], cache_dir, timeout=60)
    assert_refused(proc, expected)
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()


def test_earlier_run_is_not_overwritten_without_the_flag(tmp_path, cache_dir):
    """Files of no ledger (another tool's run): named, not sent to --overwrite_output_dir, which would refuse
    them too; a run of this project's (its ledger) is sent there."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "eval_results.json").write_text('{"accuracy": 0.9}\n')
    (out / "model.safetensors").write_bytes(b"weights of an earlier run")
    before = snapshot(out)
    # In this process: the same refusal as a program under every launcher of the README is test_recipes'.
    proc = train_here(cache_dir, "--engine", "single", "--output_dir", str(out))
    assert_refused(proc, "holds files this project did not write (eval_results.json, model.safetensors)")
    assert snapshot(out) == before
    record(out, "eval_results.json", "model.safetensors")
    before = snapshot(out)
    proc = train_here(cache_dir, "--engine", "single", "--output_dir", str(out))
    assert_refused(proc, "already holds files of an earlier run; fix: pass --overwrite_output_dir")
    assert snapshot(out) == before


def test_debug_shows_the_traceback(tmp_path, cache_dir):
    proc = run(train_cmd("--engine", "nope", "--output_dir", str(tmp_path / "o"), "--debug"), cache_dir)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "unknown engine" in proc.stderr


# Open MPI's rank variables of a 2-rank job (rank, local rank, size, local size), left in a shell without mpirun.
MPI_VARIABLES = LAUNCHERS["mpirun"].variables
STALE_OPEN_MPI = dict(zip(MPI_VARIABLES, ("0", "0", "2", "2"), strict=True))


@pytest.mark.parametrize("command", ["doctor", "train"])
def test_stale_open_mpi_variables_without_mpirun_are_one_line(command, tmp_path, cache_dir):
    """MPI starts a world of one there while the variables promise two ranks: the DDP process group waited for the
    second until --ddp_timeout (30 min). One line naming the variables instead, at once."""
    args = ["--engine", "ddp", "--output_dir", str(tmp_path / "out")] if command == "train" else []
    before = snapshot(tmp_path)
    started = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "python"), "-m", "horovod_train", command, *args],
        cwd=REPO,
        env={**base_env(cache_dir), **STALE_OPEN_MPI},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert_refused(proc, f"{MPI_VARIABLES.world_size}=2 but MPI started 1 process(es)")
    assert all(name in proc.stderr for name in STALE_OPEN_MPI) and "or launch with mpirun" in proc.stderr
    assert time.monotonic() - started < 120
    assert snapshot(tmp_path) == before


def test_help_and_a_refused_flag_start_without_torch_or_transformers_models(tmp_path):
    """Only the named command's module is imported: `--help` and a flag refused while parsing answer in about a
    second, without torch (2 s) and transformers' models (3 s); `train --help` lists every section's flags. So
    does an --output_dir a one-process run would refuse (it judges it before it loads anything), and a missing
    checkpoint to resume from. One fresh interpreter runs every command line in turn and lists what is loaded
    after each: none loads torch, so each list shows what that command line alone loaded."""
    probe = (
        "import json, sys\nfrom horovod_train.cli.main import main\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    print('--- next', flush=True)\n    print('--- next', file=sys.stderr, flush=True)\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "    print('loaded:', sorted({'torch', 'transformers.modeling_utils'} & set(sys.modules)), flush=True)\n"
        "    sys.stderr.flush()"
    )
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "all_results.json").write_text("{}\n")
    record(earlier, "all_results.json")  # a run of this project's
    refusals = {
        "already holds files of an earlier run": ["train", "--output_dir", str(earlier)],
        "does not exist": ["train", "--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint", "gone"],
    }
    argvs = [["--help"], ["train", "--help"], ["train", "--engine", "nosuch"], ["bench", "project", "--help"],
             *refusals.values()]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", probe, json.dumps(argvs)], capture_output=True, text=True, timeout=120)
    outs, errs = proc.stdout.split("--- next\n")[1:], proc.stderr.split("--- next\n")[1:]
    assert proc.returncode == 0 and len(outs) == len(errs) == len(argvs), (proc.stdout[-2000:], proc.stderr[-2000:])
    for argv, stdout, stderr in zip(argvs, outs, errs, strict=True):
        assert stdout.splitlines()[-1] == "loaded: []", (argv, stdout[-2000:], stderr[-2000:])
        refused = [problem for problem, refused_argv in refusals.items() if refused_argv == argv]
        assert not refused or refused[0] in stderr, (argv, stderr[-2000:])
        if argv == ["train", "--help"]:
            assert all(f"--{flag}" in stdout for flag in ("learning_rate", "engine", "gradient_predivide_factor"))


# What an earlier torchrun leaves in a shell (export, or a copied job script): rank 0 of 2, no torchrun running.
STALE_TORCHRUN = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}


def test_stale_torchrun_variables_say_what_they_wait_for_and_end_in_one_line(tmp_path, cache_dir):
    """The process group waited silently for --ddp_timeout (1800 s), then printed a 34-line traceback (DistStoreError
    ... 1/2 clients joined). Now: who is missing, after a few seconds, with the variables to unset; one line at the
    timeout; nothing written."""
    port = str(free_port())
    before = snapshot(tmp_path)
    proc = subprocess.run(
        [str(BIN / "python"), "-m", "horovod_train", "train", "--engine", "ddp", "--ddp_timeout", "8",
         "--output_dir", str(tmp_path / "out")],
        cwd=REPO, env={**base_env(cache_dir), **STALE_TORCHRUN, "MASTER_PORT": port},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    waiting, error = proc.stderr.strip().splitlines()
    assert waiting.startswith(f"waiting for 1 of 2 ranks at 127.0.0.1:{port} (env://)"), proc.stderr
    assert (
        "not by a running torchrun" in waiting
        and "`unset RANK LOCAL_RANK WORLD_SIZE MASTER_ADDR MASTER_PORT`" in waiting
    )
    assert_one_line(proc.returncode, error, proc.stdout, f"1 of 2 ranks never joined at 127.0.0.1:{port} (env://)")
    assert snapshot(tmp_path) == before


# A sample of tests/unit/test_data_sources.py's bad data combinations, as real programs: issue 56's duplicated
# column (a 56-line traceback), JSON object (blamed on "a single label") and non-UTF-8 file (a datasets log line
# before the error), each now one line on the program's own stderr.
BAD_DATA_SAMPLE = [
    ("text column twice", ".csv", "train"),
    ("one json object", ".json", "train"),
    ("latin-1", ".csv", "train"),
]


@pytest.mark.parametrize(("defect", "suffix", "split"), BAD_DATA_SAMPLE)
def test_bad_data_is_refused_in_one_line_by_the_program(defect, suffix, split, tmp_path, cache_dir):
    case = bad_data(defect, suffix, split, n=8, seed=1, line=3)
    flags = case.write(tmp_path)
    before = snapshot(tmp_path)
    proc = run(train_cmd("--engine", "single", "--output_dir", str(tmp_path / "out"), *flags), cache_dir, timeout=120)
    assert_refused(proc, case.cause.replace("{dir}", str(tmp_path)))
    assert "single label" not in proc.stderr
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()
