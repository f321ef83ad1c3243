"""The run directory's promises, trained in the test process (engine single, tiny-bert): one job per directory,
nothing this project did not write is ever touched, a checkpoint from elsewhere is input (read, never written,
rotated or deleted), every file a run writes is in its ledger, and the best checkpoint is the run's own or the
one it resumed from."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.jobs import SMALL_JOB

from horovod_train.cli.main import main
from horovod_train.common.errors import UsageError
from horovod_train.common.files import current_umask
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs import run_directory as outdir

pytestmark = pytest.mark.slow

JOB = ["train", "--engine", "single", *SMALL_JOB, "--synthetic_num_examples", "300", "--save_strategy", "steps"]


def train(out: Path, *args: str) -> int:
    """The run's exit code (0, or 2 for bad input)."""
    try:
        return main([*JOB, "--output_dir", str(out), *args])
    except SystemExit as exited:
        return int(exited.code)


def snapshot(root: Path) -> dict[str, bytes]:
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir) -> dict[str, Path]:
    """Two finished runs of the same job: ``src`` (checkpoints 2, 4) to resume from, and ``other``, whose
    copies stand for a directory that already holds a run. A learning rate of 1e-12 (an update below float32's
    resolution) makes the two evaluations tie, so the best checkpoint is the first (a tie does not replace it)."""
    os.environ["HOROVOD_TRAIN_CACHE"] = str(cache_dir)  # restored after each test by the root conftest
    root = tmp_path_factory.mktemp("runs")
    made = {}
    for name in ("src", "other"):
        args = ["--max_steps", "4", "--save_steps", "2", "--eval_strategy", "steps", "--eval_steps", "2"]
        assert train(root / name, *args, "--metric_for_best_model", "eval_loss", "--learning_rate", "1e-12") == 0
        made[name] = root / name
    return made


@pytest.fixture(autouse=True)
def in_process(cache_dir, monkeypatch) -> None:
    monkeypatch.setenv("HOROVOD_TRAIN_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


HOLDS = ("missing", "empty", "finished run", "unfinished attempt")
FOREIGN = {  # files of the user's beside what the directory holds
    "none": {},
    "unrelated": {"slurm-7.out": "step 1\n", "notes/thesis.tex": "\\chapter{Mine}\n"},
    # under a name save_pretrained writes (for decoders; a finished run of tiny-bert's holds none, so it is the user's)
    "clashing": {"generation_config.json": '{"mine": true}\n', "notes/thesis.tex": "\\chapter{Mine}\n"},
}
RESUMES = (None, "auto", "own checkpoint", "checkpoint elsewhere")


def fill(out: Path, holds: str, foreign: str, other: Path) -> None:
    """``out`` as an earlier run and the user left it."""
    if holds != "missing" or foreign != "none":
        out.mkdir(parents=True)
    if holds == "finished run":
        shutil.copytree(other, out, dirs_exist_ok=True)
    if holds == "unfinished attempt":  # killed before its first checkpoint: the ledger, its config, a temporary
        outdir.record(out, "run_config.json", "metrics.jsonl")
        (out / "run_config.json").write_text("{}\n")
        (out / "metrics.jsonl").write_text('{"step": 1}\n')
        (out / ".checkpoint-2.x1y2.tmp").mkdir()
    for name, text in FOREIGN[foreign].items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(text)


def allowed(holds: str, foreign: str, resume: str | None, overwrite: bool) -> bool:
    """The rules of docs/failures.md ("The run directory"), written out independently of the code."""
    if resume == "own checkpoint" or (resume == "auto" and holds == "finished run"):
        return foreign != "clashing"  # continues in place: nothing removed, nothing of the user's replaced
    if resume == "auto":  # no checkpoint: starts over what an unfinished attempt left
        return foreign == "none"
    empty = holds in ("missing", "empty") and foreign == "none"
    return empty or (overwrite and foreign == "none")  # fresh: empty, or only this project's outputs to replace


@settings(max_examples=10, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    holds=st.sampled_from(HOLDS),
    foreign=st.sampled_from(sorted(FOREIGN)),
    resume=st.sampled_from(RESUMES),
    overwrite=st.booleans(),
)
@example(holds="empty", foreign="clashing", resume="checkpoint elsewhere", overwrite=False)  # a user's file replaced
@example(holds="finished run", foreign="none", resume="checkpoint elsewhere", overwrite=False)  # other's checkpoints
@example(holds="finished run", foreign="unrelated", resume="auto", overwrite=False)  # a requeue beside its SLURM log
def test_a_run_keeps_every_promise_about_its_directory(tmp_path_factory, runs, holds, foreign, resume, overwrite):
    if resume == "own checkpoint" and holds != "finished run":
        resume = "auto"  # nothing of its own to name
    out = tmp_path_factory.mktemp("out") / "run"
    fill(out, holds, foreign, runs["other"])
    flags = ["--overwrite_output_dir"] if overwrite else []
    if resume is not None:
        checkpoint = {"auto": "auto", "own checkpoint": str(out / "checkpoint-2")}.get(resume)
        flags += ["--resume_from_checkpoint", checkpoint or str(runs["src"] / "checkpoint-2")]
    before, source = snapshot(out), snapshot(runs["src"])
    users = {name: before[name] for name in FOREIGN[foreign]}

    code = train(out, "--max_steps", "6", "--save_steps", "2", "--save_total_limit", "1", *flags)

    assert snapshot(runs["src"]) == source  # a checkpoint from elsewhere is input
    after = snapshot(out)
    assert {name: after.get(name) for name in users} == users  # nothing this project did not write is touched
    assert code == (0 if allowed(holds, foreign, resume, overwrite) else 2), (holds, foreign, resume, overwrite)
    if code == 2:
        assert after == before  # refused: nothing written, nothing removed
        return
    assert json.loads((out / "all_results.json").read_text())["global_step"] == 6
    # Everything the run wrote is in its ledger: only the user's files are foreign.
    assert outdir.foreign_entries(out) == sorted({name.split("/")[0] for name in users})
    kept = [p.name for p in outdir.RunDirectory(out).checkpoints()]
    lineage = json.loads((out / kept[-1] / ckpt.TRAINER_FILE).read_text())["lineage"]
    assert kept[-1] == "checkpoint-6" and set(kept) <= set(lineage)


def test_resumed_from_elsewhere_the_best_is_the_source_runs_and_is_loaded_at_the_end(tmp_path, runs, capsys):
    """The best checkpoint of the run resumed from lives in its own directory: loaded from there (a name inside
    the new directory found nothing, or another run's checkpoint of that name)."""
    src = tmp_path / "src"
    shutil.copytree(runs["src"], src)
    assert json.loads((src / "checkpoint-4" / ckpt.TRAINER_FILE).read_text())["best_model_checkpoint"] == "checkpoint-2"
    args = ["--max_steps", "6", "--save_steps", "2", "--eval_strategy", "steps", "--eval_steps", "2",
            "--metric_for_best_model", "eval_loss", "--load_best_model_at_end",
            "--resume_from_checkpoint", str(src / "checkpoint-4")]  # fmt: skip
    out = tmp_path / "new"
    capsys.readouterr()
    assert train(out, *args) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"] in (str(src / "checkpoint-2"), str(out / "checkpoint-6"))
    if state["best_model_checkpoint"] == str(src / "checkpoint-2"):
        assert f"loaded the best model: {src / 'checkpoint-2'}" in capsys.readouterr().out
    # The source's best deleted: forgotten at the start with a warning, not a failure after all the training.
    shutil.rmtree(src / "checkpoint-2")
    capsys.readouterr()
    assert train(tmp_path / "newer", *args) == 0
    assert "warning: the best checkpoint so far cannot be loaded at the end" in capsys.readouterr().err
    state = json.loads((tmp_path / "newer" / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"] == str(tmp_path / "newer" / "checkpoint-6")
    assert (tmp_path / "newer" / "model.safetensors").is_file()


def test_a_second_job_hears_in_use_before_what_the_first_wrote(tmp_path, capsys):
    """The lock is taken before the directory is judged: the second job, with no flags, is not told that the
    directory "already holds files of an earlier run"."""
    out = tmp_path / "busy"
    first = outdir.OutputDirLock(out)
    first.acquire()
    (out / "run_config.json").write_text("{}\n")  # what the first job has written so far
    try:
        capsys.readouterr()
        assert train(out, "--max_steps", "2", "--save_steps", "2") == 2
        assert f"is in use by another job (pid {os.getpid()} on " in capsys.readouterr().err
    finally:
        first.release()


def test_the_early_look_refuses_as_claim_does_and_leaves_a_held_directory_to_claim(tmp_path):
    """A one-process run's look before it loads torch (cli.refuse_output_dir_early): claim's refusals, nothing written;
    a directory whose lock a job holds is not judged there, so the second job still hears "in use"."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    with pytest.raises(UsageError, match="holds files this project did not write \\(notes.txt\\)"):
        outdir.RunDirectory(out).refuse_early(overwrite=True, resume=None)
    with pytest.raises(UsageError, match="--resume_from_checkpoint .*gone does not exist"):
        outdir.RunDirectory(tmp_path / "new").refuse_early(overwrite=False, resume=str(tmp_path / "gone"))
    holder = outdir.OutputDirLock(out)
    holder.acquire()
    try:
        outdir.RunDirectory(out).refuse_early(overwrite=True, resume=None)
        with pytest.raises(UsageError, match="is in use by another job"):
            outdir.RunDirectory(out).claim(overwrite=True, resume=None)
    finally:
        holder.release()
    assert snapshot(out) == before and not (tmp_path / "new").exists()


def one_error_line(capsys, text: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and text in err[0], err


def test_a_run_inside_another_runs_directory_or_checkpoint_is_refused_and_never_deleted_with_it(tmp_path, runs, capsys):
    """Issue 56 item 1: `--output_dir A/checkpoint-2/B` was accepted, and A's rotation or --overwrite_output_dir
    then deleted checkpoint-2 with all of B (a checkpoint was taken as A's own because it held a manifest); a
    resume from B's checkpoint with `--overwrite_output_dir --output_dir A` read it, then deleted it."""
    a = tmp_path / "A"
    shutil.copytree(runs["other"], a)
    before = snapshot(a)
    capsys.readouterr()
    assert train(a / "checkpoint-2" / "B", "--max_steps", "2", "--save_steps", "2") == 2
    one_error_line(capsys, f"--output_dir {a / 'checkpoint-2' / 'B'} lies inside the checkpoint {a / 'checkpoint-2'}")
    assert train(a / "sub" / "B", "--max_steps", "2", "--save_steps", "2") == 2
    one_error_line(capsys, f"lies inside {a}, the directory of another run")
    assert snapshot(a) == before
    # B as the fix found it, made inside A's checkpoint earlier: every start that would delete it is refused.
    shutil.copytree(runs["src"], a / "checkpoint-2" / "B")
    before = snapshot(a)
    assert (
        train(a, "--max_steps", "6", "--save_steps", "2", "--resume_from_checkpoint", "auto", "--save_total_limit", "1")
        == 2
    )
    one_error_line(capsys, f"--output_dir {a} holds checkpoint-2/B, which this project did not write")
    assert train(a, "--max_steps", "6", "--save_steps", "2", "--overwrite_output_dir") == 2
    one_error_line(capsys, "holds files this project did not write (checkpoint-2/B)")
    inner = a / "checkpoint-2" / "B" / "checkpoint-4"
    assert (
        train(
            a, "--max_steps", "6", "--save_steps", "2", "--overwrite_output_dir", "--resume_from_checkpoint", str(inner)
        )
        == 2
    )
    one_error_line(capsys, f"--resume_from_checkpoint {inner} lies inside --output_dir {a}, which a fresh start")
    assert snapshot(a) == before


def test_a_fresh_start_never_empties_the_directory_it_loads_its_model_from(tmp_path, runs, capsys):
    """Fine-tuning further from a run's checkpoint (or its final model) into that run's own directory: the reset
    deleted the model the run had just loaded, and run_config.json named a path that then held the new run's files.
    Refused with one line, nothing touched; `auto` starting over there (no checkpoint left to resume) too."""
    a = tmp_path / "A"
    shutil.copytree(runs["src"], a)
    before = snapshot(a)
    capsys.readouterr()
    further = ["--max_steps", "2", "--save_steps", "2", "--overwrite_output_dir"]
    for model, where in ((a / "checkpoint-2", "lies inside"), (a, "is")):
        assert train(a, *further, "--model_name_or_path", str(model)) == 2
        one_error_line(capsys, f"--model_name_or_path {model} {where} --output_dir {a}, which a fresh start empties")
    assert train(a, *further, "--tokenizer_name", str(a / "checkpoint-4")) == 2
    one_error_line(capsys, f"--tokenizer_name {a / 'checkpoint-4'} lies inside --output_dir {a}")
    assert snapshot(a) == before
    for checkpoint in a.glob("checkpoint-*"):  # a finished run that kept no checkpoint: `auto` starts over
        shutil.rmtree(checkpoint)
    before = snapshot(a)
    assert train(a, *further, "--model_name_or_path", str(a), "--resume_from_checkpoint", "auto") == 2
    one_error_line(capsys, f"--model_name_or_path {a} is --output_dir {a}, which a fresh start empties")
    assert snapshot(a) == before


def test_rotation_and_reset_remove_a_checkpoint_only_when_it_holds_nothing_its_manifest_does_not_list(tmp_path, runs):
    """A user's file put into a checkpoint since it was written: the checkpoint is left whole."""
    out = tmp_path / "run"
    shutil.copytree(runs["other"], out)
    (out / "checkpoint-2" / "notes.txt").write_text("mine")
    assert outdir.unlisted(out / "checkpoint-2") == ["notes.txt"]
    assert outdir.unlisted(out / "checkpoint-4") == [] and outdir.unlisted(out) is None
    kept = snapshot(out / "checkpoint-2")
    checkpoints = ckpt.Checkpoints(outdir.RunDirectory(out), keep=1, lineage=["checkpoint-2", "checkpoint-4"])
    checkpoints.rotate(keep_also="checkpoint-4")
    assert snapshot(out / "checkpoint-2") == kept
    assert outdir.foreign_entries(out) == ["checkpoint-2"]
    outdir.reset(out)  # what --overwrite_output_dir removes (the check before refuses such a directory)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2"] and snapshot(out / "checkpoint-2") == kept


def test_a_job_of_compare_or_bench_runs_in_a_name_its_command_recorded_for_it(tmp_path):
    """compare and bench run their jobs inside their own directory, under names they recorded up front."""
    with outdir.claimed(str(tmp_path / "compare"), overwrite=False, outputs=["logs", "single"]) as out:
        outdir.RunDirectory(out / "single").check_inputs(resume=None)
        with pytest.raises(UsageError, match="lies inside .*compare, the directory of another run"):
            outdir.RunDirectory(out / "elsewhere").check_inputs(resume=None)


def test_a_file_of_another_origin_under_any_name_the_run_writes_is_refused_by_a_run_continuing_in_place(tmp_path):
    """Every name RunFiles spells is one the run would replace: a run continuing in place refuses a foreign file
    there (RUN_OUTPUTS is made from those names, so that a name added there is protected too)."""
    files = outdir.RunFiles
    names = [files.CONFIG, files.METRICS, files.TRAIN_RESULTS, files.EVAL_RESULTS, files.TRAINER_STATE, files.FINISHED,
             files.TRAINING_CURVES, files.MODEL_CARD, files.predictions("test"),
             files.predictions("test_mismatched")]  # fmt: skip
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / name).write_text("mine")
        with pytest.raises(UsageError, match=f"holds {name}, which this project did not write and the run would"):
            outdir.RunDirectory(tmp_path / name).judge(overwrite=False, resume="auto")
    (tmp_path / "slurm-1.out").mkdir()
    (tmp_path / "slurm-1.out" / "slurm-1.out").write_text("a scheduler's log")
    outdir.RunDirectory(tmp_path / "slurm-1.out").judge(overwrite=False, resume="auto")  # a name the run never writes


def test_an_elastic_worker_recognises_its_job_by_the_configuration_the_run_wrote(tmp_path, monkeypatch):
    """The trainer writes the run's configuration and an elastic worker started later reads it, both through the
    run directory: a worker of the same horovodrun (its rendezvous) joins the running job, one of another does not,
    nor one where no run has written its configuration yet."""
    from horovod_train.engines.horovod import elastic

    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "10.0.0.1")
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", "4242")
    run_dir = outdir.RunDirectory(tmp_path / "run")
    assert not elastic.joins_running_job(run_dir.read_config())
    run_dir.begin(fresh=True)
    run_dir.write_config({"launch_id": elastic.launch_id(), "engine": "horovod"})
    assert elastic.joins_running_job(outdir.RunDirectory(tmp_path / "run").read_config())
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", "4243")  # the next horovodrun on that directory
    assert not elastic.joins_running_job(outdir.RunDirectory(tmp_path / "run").read_config())


def test_a_resume_in_place_widens_and_names_only_what_it_wrote(tmp_path, runs, capsys):
    """Issue 56 items 2 and 8: after a resume in place every *.safetensors in the directory got the umask's mode
    (the user's private.safetensors 0600 -> 0644), and the `wrote` line left out the model and results it
    rewrote."""
    out = tmp_path / "run"
    shutil.copytree(runs["other"], out)
    (out / "private.safetensors").write_bytes(b"mine")
    (out / "private.safetensors").chmod(0o600)
    (out / "model.safetensors").chmod(0o600)  # as safetensors writes it: the run's own, to widen
    capsys.readouterr()
    assert train(out, "--max_steps", "6", "--save_steps", "2", "--resume_from_checkpoint", "auto") == 0
    assert stat.S_IMODE((out / "private.safetensors").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o666 & ~current_umask()
    (wrote,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    names = set(wrote.removeprefix(f"wrote {out}/: ").split(", "))
    rewritten = {"model.safetensors", "config.json", "tokenizer.json", "all_results.json", "trainer_state.json"}
    assert rewritten | {"checkpoint-6/", "run_config.json", "metrics.jsonl"} <= names, wrote
    assert not names & {"private.safetensors", "checkpoint-2/", "checkpoint-4/"}, wrote


def test_a_dangling_symlink_output_dir_is_named_as_such(tmp_path):
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(UsageError, match="is a symbolic link to .*gone, which does not exist"):
        outdir.RunDirectory(link).claim(overwrite=False, resume=None)


def test_the_lock_is_exclusive_and_leaves_no_directory_behind(tmp_path):
    target = tmp_path / "a" / "b"
    first, second = outdir.OutputDirLock(target), outdir.OutputDirLock(target)
    first.acquire()
    with pytest.raises(UsageError, match=f"in use by another job \\(pid {os.getpid()} on "):
        second.acquire()
    assert target.is_dir()  # the refused one must not remove what the holder uses
    first.release()
    assert not (tmp_path / "a").exists()  # made only to hold the lock, and the run wrote nothing
    second.acquire()
    second.release()


def acquire_as_another_user(directory: Path) -> tuple[int, str]:
    """Acquire the lock on ``directory`` in a forked child running as nobody: (exit code, error line)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exec, so it needs no access to this interpreter's files
        code = 1
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            outdir.OutputDirLock(directory).acquire()
            code = 0 if (directory / outdir.RunFiles.LOCK).stat().st_uid == 65534 else 3
        except UsageError as error:
            os.write(write, str(error).encode())
            code = 2
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            os.write(write, repr(error).encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")
@pytest.mark.parametrize("mode", [0o644, 0o600])
def test_a_stale_lock_file_of_another_user_is_replaced(mode):
    """A job of another user killed in a shared directory left its lock file, which this user cannot open for
    writing: it was a PermissionError traceback. Nobody holds it, so it is replaced."""
    shared = Path(tempfile.mkdtemp(prefix="hvt-shared-"))  # pytest's tmp_path is root's alone
    try:
        shared.chmod(0o777)
        (shared / outdir.RunFiles.LOCK).write_text('{"host": "n1", "pid": 1, "since": "then"}\n')
        os.chown(shared / outdir.RunFiles.LOCK, 12345, 12345)
        (shared / outdir.RunFiles.LOCK).chmod(mode)
        assert acquire_as_another_user(shared) == (0, "")
        # Held by a running job of another user: "in use", not a traceback.
        holder = outdir.OutputDirLock(shared)
        holder.acquire()
        try:
            os.chown(shared / outdir.RunFiles.LOCK, 12345, 12345)
            (shared / outdir.RunFiles.LOCK).chmod(0o644)
            code, message = acquire_as_another_user(shared)
            assert code == 2 and f"is in use by another job (pid {os.getpid()} on " in message, message
        finally:
            holder.release()
        # In a sticky directory (/tmp's kind) another user's unreadable lock file can be neither opened nor replaced.
        shared.chmod(0o1777)
        (shared / outdir.RunFiles.LOCK).write_text("")
        os.chown(shared / outdir.RunFiles.LOCK, 12345, 12345)
        (shared / outdir.RunFiles.LOCK).chmod(0o600)
        code, message = acquire_as_another_user(shared)
        assert code == 2 and "can neither open nor replace" in message, message
    finally:
        shutil.rmtree(shared)
