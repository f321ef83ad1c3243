"""The GPU check's parts that need no process of their own: its plan and budget, the wheels it keeps for a later
run, its comparison of two saved models, its bundle's trimming, and bert-base's configuration for its runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from horovod_train.engines import specs
from horovod_train.gpucheck import bundle, check, checks, node, runner, steps, wheels
from horovod_train.gpucheck.runner import CheckFailed, Context, Step

EIGHT_MINUTES = 480


def node_context(tmp_path: Path, budget_s: float = check.DEFAULT_BUDGET_S, dry_run: bool = False) -> Context:
    """The check's context on a GPU node (dry_run: the same plan rehearsed on the CPU), everything in tmp_path: the
    default work directory (TMPDIR/hvt-gpu-check-<pid>) is removed by main only, not by run_steps."""
    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    args = parser.parse_args(["--scripts_dir", "scripts", "--output_dir", str(tmp_path / "out"),
                              "--work_dir", str(tmp_path / "work"), "--budget_s", str(budget_s)])  # fmt: skip
    args.dry_run = dry_run
    return check.make_context(args)


def test_the_node_plan_fits_eight_minutes_most_valuable_steps_first(tmp_path, monkeypatch):
    """The steps the default budget keeps add up to at most 8 minutes on the node; the facts come first, then the
    builds, the collectives, the bf16 throughput and MFU, then two ranks on one GPU; the rest only as time allows."""
    monkeypatch.delenv("HVT_WHEELS", raising=False)
    ctx = node_context(tmp_path)
    plan = steps.plan(ctx)
    rows = check.report.plan_rows(plan, ctx.args.budget_s)
    planned = [r["name"] for r in rows if r["within_budget"]]
    assert sum(r["estimate_s"] for r in rows if r["within_budget"]) <= EIGHT_MINUTES
    assert planned[:6] == ["nvidia_smi", "environment", "deps", "builds", "hvd_collectives", "bench_b128"]
    assert {"equiv_single", "equiv_horovod", "equiv_ddp", "bert_fp16", "ddp_demo"} <= set(planned)
    assert "bench_compile_b128" not in planned and all(step.estimate_s > 0 for step in plan)
    assert not any(r["within_budget"] for r in rows[len(planned) :])  # the budget cuts from the end


def test_the_step_shapes_bench_is_planned_past_the_budget_and_bench_gpu_takes_its_command(tmp_path, monkeypatch):
    """Issue 59's measurement: `--steps bench_shapes_b256` on the node; its command is bench gpu's."""
    import argparse

    from horovod_train.bench.gpu import arguments as gpu

    monkeypatch.delenv("HVT_WHEELS", raising=False)
    ctx = node_context(tmp_path)
    ctx.args.steps = "bench_shapes_b256"
    (step,) = steps.plan(ctx)
    parser = argparse.ArgumentParser()
    gpu.add_arguments(parser)
    args = parser.parse_args(step.cmd[step.cmd.index("gpu") + 1 :])
    gpu.validate(args)
    assert args.variants == ["eager", "bucketed", "compiled", "cudagraphs", "loop"] and args.engines == ["single"]
    assert args.length_buckets == 4 and args.per_device_train_batch_size == 256


def test_the_decoder_bench_follows_the_step_shapes_bench_past_the_budget_and_bench_gpu_takes_it(tmp_path, monkeypatch):
    """Issue 59's padding-free step on decoder-0.5b: planned right after bench_shapes_b256, past the default budget,
    selected by `--steps`; its command is bench gpu's, without a compiled variant (minutes of Inductor)."""
    from horovod_train.bench.gpu import arguments as gpu

    monkeypatch.delenv("HVT_WHEELS", raising=False)
    ctx = node_context(tmp_path)
    rows = check.report.plan_rows(steps.plan(ctx), ctx.args.budget_s)
    names = [r["name"] for r in rows]
    assert names[-2:] == ["bench_shapes_b256", "bench_decoder_b256"] and not rows[-1]["within_budget"]
    assert rows[-1]["estimate_s"] == steps.ESTIMATES_S["bench_decoder_b256"]
    ctx.args.steps = "nvidia_smi,bench_decoder_b256"
    assert [s.name for s in steps.plan(ctx)] == ["nvidia_smi", "bench_decoder_b256"]
    step = steps.plan(ctx)[1]
    parser = argparse.ArgumentParser()
    gpu.add_arguments(parser)
    args = parser.parse_args(step.cmd[step.cmd.index("gpu") + 1 :])
    assert args.model == "decoder-0.5b"  # validate takes its tiny one here, without CUDA
    gpu.validate(args)
    assert args.precision == "bf16" and args.engines == ["single"]
    assert args.variants == ["eager", "bucketed", "padding_free"] and args.per_device_train_batch_size == 256
    assert step.check is checks.check_bench and step.run_dir == Path(args.output_dir)


def tiny_decoder_bench(folder: Path) -> Step:
    """bench gpu's real output for the decoder step's variants, on tiny-llama (fp32, a few steps)."""
    from horovod_train.cli.main import main

    sizes = ["--steps", "2", "--warmup", "1", "--repeats", "1", "--per_device_train_batch_size", "4"]
    assert main(["bench", "gpu", "--tiny", "--model", "tiny-llama", "--engines", "single", "--variants", "eager",
                 "bucketed", "padding_free", "--bf16", "false", *sizes, "--output_dir", str(folder)]) == 0  # fmt: skip
    return Step("bench_decoder_b256", "the decoder bench", ["true"], 1.0, run_dir=folder)


def rewrite_rows(step: Step, change) -> None:
    assert step.run_dir is not None
    path = step.run_dir / "gpu.json"
    report = json.loads(path.read_text())
    report["rows"] = change(report["rows"])
    path.write_text(json.dumps(report))


def test_the_bench_check_passes_the_decoders_rows_and_the_report_shows_its_padding_free_step(
    tmp_path, monkeypatch, capsys
):
    """A real gpu.json of the decoder step's variants passes: every row there with a finite loss, padding-free's
    eager's; the report says how padding-free did and keeps the decoder out of BERT's targets."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ctx = node_context(tmp_path, dry_run=True)
    step = tiny_decoder_bench(tmp_path / "bench")
    detail, metrics = checks.check_bench(ctx, step, "")
    flat = metrics["single/padding_free"]
    assert set(metrics) >= {"single", "single/bucketed", "single/padding_free"} and metrics["model"] == "tiny-llama"
    assert flat["loss_vs_eager"] <= 1e-5 and flat["tolerance"] == checks.VARIANT_LOSS_TOLERANCE
    assert "padding_free loss" in detail and "horovod" not in detail
    entry = {"name": step.name, "status": "ok", "seconds": 1.0, "estimate_s": 1.0, "detail": detail,
             "metrics": metrics}  # fmt: skip
    built = check.report.build(ctx, [step], [entry], done=True)
    assert built["bench"] == {} and built["padding_free"]["loss"] == flat["loss"]
    (line,) = [x for x in check.report.result_lines(built) if x.startswith("padding-free (bench_decoder_b256")]
    assert f"last loss {flat['loss']:.4f} (padded: {metrics['single']['loss']:.4f})" in line
    paths = {p["path"]: p["state"] for p in built["paths"]}
    assert [state for path, state in paths.items() if "padding-free" in path] == ["ran on the CPU (dry run)"]


def off_by(fraction: float):
    def change(rows: list[dict]) -> list[dict]:
        return [r | {"loss": r["loss"] * (1 + fraction)} if r["variant"] == "padding_free" else r for r in rows]

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (off_by(3 * checks.VARIANT_LOSS_TOLERANCE), r"padding_free's last loss .* is 6\.0e-02 from eager's"),
        (lambda rows: [r for r in rows if r["variant"] != "bucketed"], r"rows missing: \['single/bucketed'\]"),
        (lambda rows: [r | {"loss": float("nan")} if r["variant"] == "eager" else r for r in rows], "'single': nan"),
    ],
    ids=["padding-free-loss-off", "row-missing", "loss-not-finite"],
)
def test_the_bench_check_fails_a_padding_free_loss_off_eagers_a_missing_row_or_a_nan(
    tmp_path, monkeypatch, change, message
):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ctx = node_context(tmp_path, dry_run=True)
    step = tiny_decoder_bench(tmp_path / "bench")
    checks.check_bench(ctx, step, "")  # as bench wrote it: passes
    rewrite_rows(step, change)
    with pytest.raises(CheckFailed, match=message):
        checks.check_bench(ctx, step, "")


def tiny_loop_bench(folder: Path) -> Step:
    """bench gpu's real output for the loop beside the bare bucketed step, on tiny-bert (fp32, a few steps)."""
    from horovod_train.cli.main import main

    sizes = ["--steps", "2", "--warmup", "1", "--repeats", "1", "--per_device_train_batch_size", "4"]
    assert main(["bench", "gpu", "--tiny", "--engines", "single", "--variants", "bucketed", "loop", "--bf16", "false",
                 *sizes, "--output_dir", str(folder)]) == 0  # fmt: skip
    return Step("bench_shapes_b256", "the step shapes bench", ["true"], 1.0, run_dir=folder)


def test_the_bench_check_records_the_loops_ratio_to_the_bare_step_and_flags_it_below_the_floor(tmp_path, monkeypatch):
    """Issue 59's `train` within 5% of the bench: a real gpu.json with the loop's row passes with its samples/s over
    the bare bucketed step's recorded; a ratio under checks.LOOP_VS_BARE_FLOOR is flagged, not failed; the loop's
    row missing, or its loss not finite, fails."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ctx = node_context(tmp_path, dry_run=True)
    step = tiny_loop_bench(tmp_path / "bench")
    detail, metrics = checks.check_bench(ctx, step, "")
    loop, bare = metrics["single/loop"], metrics["single/bucketed"]
    assert loop["vs_bare"] == pytest.approx(loop["samples_per_second"] / bare["samples_per_second"], rel=1e-12)
    assert loop["floor"] == checks.LOOP_VS_BARE_FLOOR == 0.95
    assert loop["below_floor"] == (loop["vs_bare"] < 0.95) and f"train's loop {loop['vs_bare']:.3f}x" in detail

    def loop_at(ratio: float):
        return lambda rows: [r | {"vs_bare": ratio} if r["variant"] == "loop" else r for r in rows]

    rewrite_rows(step, loop_at(0.9))
    detail, metrics = checks.check_bench(ctx, step, "")
    assert metrics["single/loop"]["below_floor"] and "FLAGGED: below 0.95" in detail
    rewrite_rows(step, loop_at(0.99))
    detail, metrics = checks.check_bench(ctx, step, "")
    assert not metrics["single/loop"]["below_floor"] and "FLAGGED" not in detail
    rewrite_rows(step, lambda rows: [r | {"loss": float("inf")} if r["variant"] == "loop" else r for r in rows])
    with pytest.raises(CheckFailed, match="'single/loop': inf"):
        checks.check_bench(ctx, step, "")
    rewrite_rows(step, lambda rows: [r for r in rows if r["variant"] != "loop"])
    with pytest.raises(CheckFailed, match=r"rows missing: \['single/loop'\]"):
        checks.check_bench(ctx, step, "")


def test_an_engine_row_with_a_demo_gets_its_step_where_its_order_puts_it(tmp_path, monkeypatch):
    """The demos come from the rows (EngineSpec.gpu_demo): a new torchrun row's is ddp_demo but for its engine and
    its line, planned by its order among the later steps; a row without a demo has no step."""
    monkeypatch.delenv("HVT_WHEELS", raising=False)
    toy = dataclasses.replace(specs.ENGINES["ddp"], name="toy", gpu_demo=specs.GpuDemo("Toy np=1 (NCCL: its own)", 15))
    monkeypatch.setitem(specs.ENGINES, "toy", toy)
    monkeypatch.setitem(specs.ENGINES, "dp", dataclasses.replace(specs.ENGINES["dp"], gpu_demo=None))
    plan = {step.name: step for step in steps.plan(node_context(tmp_path))}
    names = list(plan)
    assert names[names.index("ddp_demo") + 1 : names.index("zero1_demo")] == ["toy_demo"] and "dp_demo" not in names
    demo, ddp = plan["toy_demo"], plan["ddp_demo"]
    expected = [word.replace("ddp_demo", "toy_demo") for word in ddp.cmd]
    expected[expected.index("--engine") + 1] = "toy"
    assert demo.cmd == expected, demo.cmd
    assert demo.what == "demo job, 1 epoch, Toy np=1 (NCCL: its own)" and demo.check is checks.check_nccl_training
    assert demo.estimate_s == steps.UNMEASURED_DEMO_S and demo.after == ddp.after


def test_steps_naming_a_step_that_reads_another_ones_files_runs_that_one_first(tmp_path, monkeypatch):
    """A rerun of `--steps equiv_horovod` on the node found no model to compare with (2026-11-28): the one process
    it compares against, and bert-base's configuration for the BERT runs, come along, in the plan's order."""
    monkeypatch.delenv("HVT_WHEELS", raising=False)
    ctx = node_context(tmp_path)
    ctx.args.steps = "doctor,bert_fp16,equiv_horovod"
    plan = steps.plan(ctx)
    assert [s.name for s in plan] == ["equiv_single", "equiv_horovod", "bert_config", "bert_fp16", "doctor"]
    assert "equiv_single" in plan[1].after and "bert_config" in plan[3].after


def test_kept_wheels_shorten_the_builds_estimate(tmp_path, monkeypatch):
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / f"{wheels.PART_PREFIX}00").write_bytes(b"x")
    monkeypatch.setenv("HVT_WHEELS", str(tmp_path / "bundle"))
    builds = next(s for s in steps.plan(node_context(tmp_path)) if s.name == "builds")
    assert builds.estimate_s == steps.KEPT_BUILDS_S < steps.ESTIMATES_S["builds"]
    assert builds.cmd[builds.cmd.index("--parts_from") + 1] == str(tmp_path / "bundle")


@pytest.mark.parametrize(("estimate", "runs"), [(30.0, True), (90.0, False)])
def test_a_step_starts_only_if_its_estimate_fits_in_the_budget_left(tmp_path, estimate, runs):
    ctx = node_context(tmp_path)
    ctx.deadline = time.monotonic() + 60
    reason = runner.why_not(ctx, Step("bench", "a step", ["true"], estimate))
    assert (reason is None) == runs
    assert runs or reason.startswith("time budget: needs ~90s")


def store(cache: Path, key: str, payload: bytes, tmp_path: Path) -> Path:
    """A wheel cached as build_horovod caches one (its SHA256SUMS beside it)."""
    from horovod_train.build_horovod.build import store_wheel

    wheel = tmp_path / "horovod-0.28.1-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(payload)
    store_wheel(wheel, cache / key)
    return cache / key / wheel.name


def test_kept_wheels_come_back_in_parts_and_build_horovod_installs_them_instead_of_building(tmp_path, monkeypatch):
    """The wheels a run built leave the node in parts under the part size, and a later run restores them into
    the wheel cache where build_horovod looks for this environment's key, digest checked."""
    from horovod_train.build_horovod import install
    from horovod_train.build_horovod.plan import Options, make_plan
    from horovod_train.build_horovod.target import running_target

    monkeypatch.setattr(wheels, "PART_BYTES", 4096)
    plan = make_plan(running_target(), Options(dry_run=True))
    built, elsewhere = tmp_path / "node-cache", tmp_path / "next-node-cache"
    payload = torch.randint(0, 256, (10_000,), dtype=torch.uint8).numpy().tobytes()
    since = time.time() - 1
    store(built, plan.key, payload, tmp_path)
    older = store(built, "horovod-older-key", b"built before this run", tmp_path)
    os.utime(older, (since - 60, since - 60))
    out = tmp_path / "out"
    out.mkdir()
    parts = wheels.keep(wheels.new_builds(built, since), out)
    assert len(parts) > 2 and all(p.stat().st_size <= 4096 for p in parts)  # 10 kB of wheel in 4 kB parts
    assert wheels.restore(out, elsewhere) == [plan.key]  # the older build was not this run's
    monkeypatch.setenv("HOROVOD_WHEEL_CACHE", str(elsewhere))
    wheel = install.cached_wheel(plan)
    assert wheel is not None and wheel.read_bytes() == payload
    install.verify_digest(wheel)  # build_horovod's own check before it installs a cached wheel
    assert wheels.restore(out, elsewhere) == []  # a folder already there stays as it is


def test_a_damaged_kept_wheel_is_refused_by_build_horovods_digest(tmp_path):
    from horovod_train.build_horovod import install
    from horovod_train.common.errors import UsageError

    since = time.time() - 1
    store(tmp_path / "cache", "horovod-key", b"a wheel" * 1000, tmp_path)
    (out := tmp_path / "out").mkdir()
    (part,) = wheels.keep(wheels.new_builds(tmp_path / "cache", since), out)
    data = bytearray(part.read_bytes())
    data[data.index(b"a wheel") + 2] ^= 0xFF
    part.write_bytes(bytes(data))
    wheels.restore(out, tmp_path / "restored")
    with pytest.raises(UsageError, match="does not match"):
        install.verify_digest(next((tmp_path / "restored" / "horovod-key").glob("*.whl")))


def saved_models(tmp_path: Path, dtype: torch.dtype, shift: float) -> tuple[Path, Path]:
    generator = torch.Generator().manual_seed(0)
    a = {
        "w": torch.randn(300, 7, generator=generator, dtype=dtype),
        "b": torch.randn(5, generator=generator, dtype=dtype),
    }
    b = {k: v.clone() for k, v in a.items()}
    b["w"][123, 4] += shift
    save_file(a, tmp_path / "a.safetensors")
    save_file(b, tmp_path / "b.safetensors")
    return tmp_path / "a.safetensors", tmp_path / "b.safetensors"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_check_reads_saved_models_as_torch_does(tmp_path, dtype):
    from safetensors.torch import load_file

    a, b = saved_models(tmp_path, dtype, 3e-5)
    x, y = load_file(a), load_file(b)
    expected = {k: (x[k].double() - y[k].double()).abs().max().item() for k in x}
    name, difference = checks.max_abs_difference(a, b)
    assert name == "w" and difference == pytest.approx(expected["w"], rel=1e-12) and expected["b"] == 0


def test_a_bf16_model_is_refused_not_misread(tmp_path):
    a, b = saved_models(tmp_path, torch.bfloat16, 0.0)
    with pytest.raises(CheckFailed, match="BF16"):
        checks.max_abs_difference(a, b)


def run_dir(folder: Path, model: Path, checksums: list[int]) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(model.read_bytes())
    results = {"world_size": len(checksums), "param_checksum_per_rank": checksums, "engine": "horovod",
               "device": "cpu", "eval_accuracy": 0.5}  # fmt: skip
    (folder / "all_results.json").write_text(json.dumps(results))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"loss": x}) + "\n" for x in (1.2, 1.0)))
    return folder


@pytest.mark.parametrize(("shift", "passes"), [(2e-6, True), (3e-5, False)])
def test_two_ranks_pass_only_within_the_equivalence_tolerance(tmp_path, shift, passes):
    """What the 2-rank steps must show: equal ranks, and the single process's parameters within 1e-5."""
    single, two_ranks = saved_models(tmp_path, torch.float32, shift)
    ctx = Context(argparse.Namespace(), "python", tmp_path / "out", tmp_path / "work", True, time.monotonic() + 60)
    run_dir(ctx.work / "runs" / "equiv_single", single, [1])
    step = Step("equiv_horovod", "2 ranks", ["true"], 1.0, run_dir=run_dir(tmp_path / "two", two_ranks, [7, 7]))
    if passes:
        detail, metrics = checks.check_equivalence(ctx, step, "")
        assert metrics["max_abs_difference"] == pytest.approx(shift, rel=0.05) and metrics["largest_in"] == "w"
    else:
        with pytest.raises(CheckFailed, match=r"parameters \d\.\d+e-05 \(max-abs, w\)"):
            checks.check_equivalence(ctx, step, "")


def test_ranks_that_disagree_fail_the_equivalence_check(tmp_path):
    single, _ = saved_models(tmp_path, torch.float32, 0.0)
    ctx = Context(argparse.Namespace(), "python", tmp_path / "out", tmp_path / "work", True, time.monotonic() + 60)
    run_dir(ctx.work / "runs" / "equiv_single", single, [1])
    step = Step("equiv_ddp", "2 ranks", ["true"], 1.0, run_dir=run_dir(tmp_path / "two", single, [7, 8]))
    with pytest.raises(CheckFailed, match=r"parameter checksums per rank \[7, 8\]"):
        checks.check_equivalence(ctx, step, "")


def test_bert_config_is_the_benchmarks_bert_base(tmp_path):
    """The check trains the architecture `bench gpu` measures (one definition, in the core)."""
    from transformers import BertConfig

    from horovod_train.bench.architectures import bert_config

    assert node.main(["bert-config", str(tmp_path / "config")]) == 0
    saved, benched = BertConfig.from_pretrained(tmp_path / "config"), bert_config("bert-base-cased")
    fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    assert [getattr(saved, f) for f in fields] == [getattr(benched, f) for f in fields] == [28996, 768, 12, 12, 3072]


def pip_report(path: Path, packages: dict[str, tuple[str, list[str]]]) -> Path:
    items = [{"metadata": {"name": name, "version": version, "requires_dist": needs}}
             for name, (version, needs) in packages.items()]  # fmt: skip
    path.write_text(json.dumps({"install": items}))
    return path


def trim(tmp_path: Path, sizes: dict[str, int], carry: str = "", max_mib: float = 50, *more: str) -> int:
    dest = tmp_path / "bundle"
    dest.mkdir(exist_ok=True)
    for name, size in sizes.items():
        with (dest / name).open("wb") as f:
            f.truncate(size)
    report = pip_report(tmp_path / "report.json", {
        "datasets": ("5.2.0", ["pyarrow>=24.0.0", "fsspec[http]<=2026.9.0,>=2023.1.0", "pytest; extra == 'tests'"]),
        "pyarrow": ("26.0.1", []), "fsspec": ("2026.9.0", []), "dill": ("0.4.1", [])})  # fmt: skip
    (tmp_path / "node.txt").write_text("# the node\npyarrow\nfsspec\nPyYAML\n")
    args = ["trim", str(dest), "--report", str(report), "--on_node", str(tmp_path / "node.txt"), "--carry", carry]
    return bundle.main([*args, "--max_mib", str(max_mib), *more])


WHEELS = {"pyarrow-26.0.1-cp312-cp312-manylinux_2_28_x86_64.whl": 52 * 2**20,
          "fsspec-2026.9.0-py3-none-any.whl": 200_000, "datasets-5.2.0-py3-none-any.whl": 600_000,
          "dill-0.4.1-py3-none-any.whl": 120_000}  # fmt: skip


def test_the_bundle_leaves_out_big_wheels_the_node_has_and_says_what_needs_them(tmp_path, capsys):
    assert trim(tmp_path, WHEELS) == 0
    out = capsys.readouterr().out
    kept = sorted(p.name for p in (tmp_path / "bundle").iterdir())
    assert kept == sorted(n for n in WHEELS if not n.startswith("pyarrow"))  # fsspec: small, carried anyway
    assert "left out pyarrow-26.0.1" in out and "datasets: pyarrow>=24.0.0" in out and "HVT_BUNDLE_WITH=pyarrow" in out
    assert "MiB in 3 files (limit 50 MiB)" in out


def test_the_bundle_carries_what_is_asked_for_and_refuses_to_grow_past_its_limit(tmp_path, capsys):
    assert trim(tmp_path, WHEELS, carry="pyarrow") == 1
    captured = capsys.readouterr()
    assert (tmp_path / "bundle" / next(iter(WHEELS))).exists() and "left out" not in captured.out
    assert captured.err.startswith("error: the bundle is 52.") and "fix:" in captured.err


def test_a_failed_dependency_install_skips_the_training_but_not_the_builds_or_the_bench(tmp_path, capsys):
    """The plan's dependencies, run by the real runner (each command a no-op here): without the wheels the node
    lacks, the runs that train need them and are skipped, but Horovod is still built and the bench (which
    imports no datasets) still measures."""
    ctx = node_context(tmp_path, dry_run=True)
    ctx.out.mkdir()
    plan = steps.plan(ctx)
    for step in plan:
        step.cmd, step.check, step.prepare = ["true"], None, None
    next(s for s in plan if s.name == "deps").error = "missing datasets, evaluate; set HVT_WHEELS to a wheel folder"
    status = {e["name"]: e["status"] for e in check.run_steps(ctx, plan, plan)["steps"]}
    assert status["deps"] == "failed" and status["builds"] == "ok" and status["bench_b8"] == "ok"
    trains = ("equiv_single", "equiv_horovod", "equiv_ddp", "ddp_demo", "horovod_demo", "bert_bf16_ddp", "dp_demo")
    assert all(status[name] == "skipped" for name in trains), status


def test_the_bundle_can_leave_out_the_small_wheels_too(tmp_path, capsys):
    assert trim(tmp_path, WHEELS, "pyarrow", 60, "--small_mib", "0") == 0
    kept = sorted(p.name for p in (tmp_path / "bundle").iterdir())
    assert kept == sorted(n for n in WHEELS if not n.startswith("fsspec"))  # pyarrow asked for; fsspec on the node
