"""`compare`: the same job under every engine with its real launcher, tabulated, saved and plotted."""

from __future__ import annotations

import pytest

from horovod_train.cli.main import main
from horovod_train.outputs.run_directory import record


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "ddp"], "--engine does not apply"),
        (["--engines", "single,nccl-magic"], "--engines nccl-magic is not supported"),
        (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size must be > 0"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(args, message, tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", *args, "--output_dir", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not out.exists()


def test_an_earlier_compare_is_not_overwritten_silently(tmp_path, capsys):
    (tmp_path / "compare.json").write_text("{}")
    record(tmp_path, "compare.json")  # an earlier compare's, by its ledger
    with pytest.raises(SystemExit):
        main(["compare", "--output_dir", str(tmp_path)])
    assert "already holds files of an earlier run" in capsys.readouterr().err
    assert (tmp_path / "compare.json").read_text() == "{}"


def test_an_engines_variant_runs_when_named_and_its_arguments_come_last():
    """fsdp's "zero2" variant (its row's, engines/specs.py) is a run of its own on this machine's table: left out of the
    default set (compare's table stays one run per engine), chosen by its name or by the engine's name, and its
    train arguments end its command line, after what compare passes through."""
    from horovod_train.launching import compare

    runs = compare.supported_runs(2)
    names = [r.name for r in runs]
    assert "fsdp-gloo" in names and "fsdp-zero2-gloo" in names
    assert "fsdp-zero2-gloo" not in [r.name for r in compare.select_runs(runs, None)]
    assert [r.name for r in compare.select_runs(runs, ["fsdp"])] == ["fsdp-gloo", "fsdp-zero2-gloo"]
    assert [r.name for r in compare.select_runs(runs, ["dp,single"])] == ["single", "dp"]  # comma separated
    (zero2,) = compare.select_runs(runs, ["fsdp-zero2-gloo"])
    command = zero2.command(["--fsdp_reshard_after_forward", "true"])
    assert command[-2:] == ["--fsdp_reshard_after_forward", "false"] and command.count("--engine") == 1
