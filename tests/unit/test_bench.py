"""The benchmarks run on CPU in tiny configurations and write well-formed CSV/JSON/PNG (no speed asserts)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from horovod_train.cli.main import main
from horovod_train.engines import specs
from horovod_train.engines.horovod.options import HorovodArguments


def test_mfu_counts_bert_base_without_its_embeddings():
    """bench gpu's FLOPs per token: BERT-base has 108.3 M parameters, 22.7 M of them in embeddings
    (lookups: no matmul FLOPs); counting them made MFU about 26 % too high. Built on the meta device
    (no memory, no weights)."""
    from transformers import BertForSequenceClassification

    from horovod_train.bench.architectures import bert_config
    from horovod_train.bench.gpu.contender import flop_parameters

    with torch.device("meta"):
        model = BertForSequenceClassification(bert_config("bert-base-cased"))
    total = sum(p.numel() for p in model.parameters())
    embeddings = sum(p.numel() for p in model.bert.embeddings.parameters())
    embeddings -= sum(p.numel() for p in model.bert.embeddings.LayerNorm.parameters())  # a LayerNorm, not a lookup
    assert round(total / 1e6, 1) == 108.3 and round(embeddings / 1e6, 1) == 22.7
    assert flop_parameters(model) == total - embeddings
    assert total / flop_parameters(model) == pytest.approx(1.265, abs=0.005)


def test_bench_gpu_times_the_training_loops_own_step(monkeypatch):
    """bench gpu measures the step the training loop takes (training/step.py), not a copy of it that could
    drift: each of its steps marks the loop's phases (step, forward, backward, optimizer step), one set per
    step, and its parameters move."""
    import argparse

    from horovod_train.bench.gpu.contender import Contender, setup_engine
    from horovod_train.config.run_config import TrainingArguments
    from horovod_train.training import phases

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the engine's setup leaves torch's threads as they are
    monkeypatch.setattr(phases, "_spans", None)  # restored after: spans are recorded for this test only
    training = TrainingArguments(max_grad_norm=1.0)
    engine = setup_engine("single", training)
    args = argparse.Namespace(seed=0, model="tiny-bert", torch_compile=False, max_seq_length=64, length_buckets=4)
    contender = Contender(engine, args, training)
    before = [p.detach().clone() for p in contender.model.parameters()]
    mask = torch.ones(4, 8, dtype=torch.long)
    batch = {"input_ids": torch.randint(5, 100, (4, 8)), "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 0])}
    spans = phases.record()
    for _ in range(2):
        contender.step(batch)
    names = [name for name, _, _ in spans]
    assert sorted(names) == sorted([phases.FORWARD, phases.BACKWARD, phases.OPTIMIZER, phases.STEP] * 2), names
    assert any(not torch.equal(a, b) for a, b in zip(before, contender.model.parameters(), strict=True))


def test_bench_gpu_times_the_padding_free_step_on_a_decoder(tmp_path, capsys, monkeypatch):
    """Issue 59: --model tiny-llama (a decoder) times the padding-free step beside the padded one, on the same
    examples from the same init: flattened into one row and kept apart by their positions, they give the padded
    batches' loss (fp32), and its row is printed."""
    import json

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "gpu"
    sizes = ["--steps", "2", "--warmup", "1", "--repeats", "1", "--per_device_train_batch_size", "4"]
    assert main(["bench", "gpu", "--tiny", "--model", "tiny-llama", "--engines", "single", "--variants",
                 "padding_free", "--bf16", "false", *sizes, "--output_dir", str(out)]) == 0  # fmt: skip
    rows = {r["variant"]: r for r in json.loads((out / "gpu.json").read_text())["rows"]}
    assert list(rows) == ["eager", "padding_free"] and all(r["model"] == "tiny-llama" for r in rows.values())
    eager, flattened = rows["eager"], rows["padding_free"]
    # Every token of a flattened batch is real: none padded, where the padded batches have some.
    assert flattened["padded_tokens_per_second"] == flattened["tokens_per_second"] > 0
    assert abs(flattened["loss"] - eager["loss"]) <= 1e-5 * eager["loss"], (flattened["loss"], eager["loss"])
    printed = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("single ")]
    assert [line[1] for line in printed] == ["eager", "padding_free"] and printed[1][-1] == f"{flattened['loss']:.4f}"


def test_bench_gpu_times_the_training_loop_beside_the_bare_step(tmp_path, capsys, monkeypatch):
    """Issue 59: --variants loop runs `train`'s training loop (its loader, meter, schedule, log line) on the bucketed
    step's examples, beside the bare bucketed step (brought along): from the same init through the same batches in
    the same order, the loss the loop logged for its last window is the bare step's mean over it (fp32, exactly),
    and the loop's row carries its samples/s over the bare step's."""
    import json

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "gpu"
    sizes = ["--steps", "2", "--warmup", "1", "--repeats", "2", "--per_device_train_batch_size", "4"]
    assert main(["bench", "gpu", "--tiny", "--engines", "single", "--variants", "loop", "--bf16", "false", *sizes,
                 "--output_dir", str(out)]) == 0  # fmt: skip
    report = json.loads((out / "gpu.json").read_text())
    rows = {r["variant"]: r for r in report["rows"]}
    assert list(rows) == ["eager", "bucketed", "loop"] and report["args"]["variants"] == ["bucketed", "loop"]
    bare, loop = rows["bucketed"], rows["loop"]
    assert loop["loss"] == bare["loss"] and loop["loss"] == loop["loss"], (loop["loss"], bare["loss"])
    assert loop["vs_bare"] == loop["samples_per_second"] / bare["samples_per_second"] > 0
    assert bare["vs_bare"] != bare["vs_bare"]  # NaN: the ratio is the loop's row's alone
    printed = capsys.readouterr().out
    # The loop's own log line, once a window (warm-up, two timed windows): the loop ran, not the bare step.
    assert [line.split()[1] for line in printed.splitlines() if line.startswith("step ")] == ["1/1", "3/3", "5/5"]
    assert f"==> loop / bare step (bucketed) samples/s: {loop['vs_bare']:.3f}x" in printed


def test_bench_gpu_builds_the_trainers_optimizer(monkeypatch):
    """bench gpu's optimizer is the one `train` builds (training/build.py build_optimizer, through the engine's
    prepare): AdamW over the trainer's two groups, weight decay on all but biases and LayerNorm weights, at the
    run's learning rate."""
    import argparse

    from horovod_train.bench.gpu.contender import Contender, setup_engine
    from horovod_train.config.run_config import TrainingArguments
    from horovod_train.training.build import decay_groups

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    training = TrainingArguments(weight_decay=0.01, learning_rate=3e-5)
    engine = setup_engine("single", training)
    args = argparse.Namespace(seed=0, model="tiny-bert", torch_compile=False, max_seq_length=64, length_buckets=4)
    contender = Contender(engine, args, training)
    names = {id(p): n for n, p in contender.model.named_parameters()}
    groups = [
        ([names[id(p)] for p in g["params"]], g["weight_decay"], g["lr"]) for g in contender.optimizer.param_groups
    ]
    decay, no_decay = decay_groups(contender.model)
    assert groups == [(decay, 0.01, 3e-5), (no_decay, 0.0, 3e-5)] and decay and no_decay


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA L40S", 362.0),
        ("Tesla V100-SXM2-32GB", None),  # no bf16 tensor cores: no MFU rather than a wrong one
    ],
)
def test_the_peak_for_mfu_comes_from_the_devices_name(name, peak):
    from horovod_train.bench.gpu.benchmark import peak_bf16_tflops

    assert peak_bf16_tflops(name) == peak


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["allreduce", "--max_bytes", "12XB"], "cannot read '12XB' as a size"),
        (["allreduce", "--min_bytes", "1MB", "--max_bytes", "4KB"], "are empty"),
        (["train", "--repeats", "0"], "--repeats must be >= 1"),
        (["train", "--engine", "ddp"], "--engine does not apply"),
        (["gpu", "--per_device_train_batch_size", "0"], "bad benchmark sizes"),
        (["gpu", "--bf16", "--fp16"], "--bf16 and --fp16 are both set"),
        (["gpu", "--mean_length", "500"], "bad benchmark sizes"),
    ],
)
def test_bench_bad_input_is_one_line(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args, "--output_dir", str(tmp_path / "never")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "never").exists()


def test_horovod_cpu_defaults_apply_only_where_unset(monkeypatch, tmp_path):
    from horovod_train.engines.horovod import env as horovod_env

    stall = ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    for name in (*horovod_env.CPU_DEFAULTS, *stall, "HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE"):
        monkeypatch.setenv(name, "")  # recorded (delenv of an unset name records nothing) ...
        monkeypatch.delenv(name)  # ... so what apply() sets is removed after the test
    yield_var = "OMPI_MCA_mpi_yield_when_idle"  # Open MPI's parameter names are lower case
    args = HorovodArguments(horovod_timeline=str(tmp_path / "t" / "timeline.json"), autotune=True)
    applied = horovod_env.apply(args, cuda=False)
    assert applied[yield_var] == "1" == os.environ[yield_var]
    assert applied["HOROVOD_TIMELINE"] == str(tmp_path / "t" / "timeline.json") and (tmp_path / "t").is_dir()
    assert applied["HOROVOD_AUTOTUNE"] == "1"
    assert applied["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "1800"  # --ddp_timeout's default
    monkeypatch.delenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    assert horovod_env.apply(args, cuda=False, timeout_s=7200)["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "7200"
    monkeypatch.setenv(yield_var, "0")  # the user's own setting wins
    assert yield_var not in horovod_env.apply(HorovodArguments(), cuda=False)
    assert os.environ[yield_var] == "0"
    monkeypatch.delenv(yield_var)
    assert yield_var not in horovod_env.apply(HorovodArguments(), cuda=True)


@pytest.mark.parametrize(
    ("groups", "cuda", "elastic", "expected"),
    [(None, True, False, None), (None, False, True, None), (0, False, False, None), (3, True, False, 3),
     (2, False, False, 2)],
)  # fmt: skip
def test_explicit_groups_gpus_and_elastic_runs_keep_horovods_groups(groups, cuda, elastic, expected):
    from horovod_train.engines.horovod import env as horovod_env

    args = HorovodArguments(horovod_groups=groups, elastic=elastic)
    assert horovod_env.optimizer_groups(args, cuda, [torch.zeros(3)]) == expected


def test_cpu_default_groups_are_buckets_of_the_models_gradients():
    """On CPU the default is gradient buckets of CPU_GROUP_MB in backward order: tiny-bert's 2.2 MB make one
    group (one fused all-reduce per step), bert-base's 329 MiB several, each sent once its gradients exist."""
    from transformers import BertForSequenceClassification

    from horovod_train.bench.architectures import bert_config
    from horovod_train.engines.horovod import env as horovod_env

    for name in ("tiny-bert", "bert-base-cased"):
        with torch.device("meta"):
            params = list(BertForSequenceClassification(bert_config(name)).parameters())
        groups = horovod_env.optimizer_groups(HorovodArguments(), False, params)
        assert [p for g in groups for p in g] == params[::-1]
        assert len(groups) == 1 if name == "tiny-bert" else len(groups) > 1
    assert horovod_env.optimizer_groups(HorovodArguments(horovod_group_mb=1e9), False, params) == [params[::-1]]


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), max_size=40), cap=st.integers(1, 20000))
def test_gradient_buckets_are_greedy_capped_runs_in_backward_order(sizes, cap):
    """Every tensor once, in reverse order; a bucket exceeds the cap only as a lone tensor; each bucket is
    full (the next tensor would not have fitted)."""
    from horovod_train.engines.horovod.env import gradient_buckets

    params = [torch.zeros(n) for n in sizes]
    buckets = gradient_buckets(params, cap * 4)
    assert [id(p) for b in buckets for p in b] == [id(p) for p in reversed(params)]
    nbytes = [sum(p.numel() * 4 for p in b) for b in buckets]
    assert all(n <= cap * 4 or len(b) == 1 for n, b in zip(nbytes, buckets, strict=True))
    assert all(nbytes[i] + buckets[i + 1][0].numel() * 4 > cap * 4 for i in range(len(buckets) - 1))


def test_bench_train_model_size_fills_only_what_the_command_line_leaves_out():
    """--model_size bert-base is issue 23's job (8 examples per rank, every step logged, 16 steps) at the machine's
    world size only; a value given on the command line wins."""
    import argparse

    from horovod_train.bench.runs import train as bench_train

    parser = argparse.ArgumentParser()
    bench_train.add_arguments(parser)
    config, world_sizes = bench_train.validate(parser.parse_args(["--model_size", "bert-base", "--max_steps", "4"]))
    training = config.training
    assert (training.max_steps, training.per_device_train_batch_size, training.logging_steps) == (4, 8, 1)
    assert training.eval_strategy == "no" and config.data.max_seq_length == 128 and world_sizes == [2]
    config, world_sizes = bench_train.validate(parser.parse_args([]))
    assert config.training.max_steps == bench_train.DEFAULT_MAX_STEPS and world_sizes == [1, 2]


def bench_train_report(samples: dict[tuple[str, int], list[float]]) -> tuple[list[list[str]], list[str]]:
    """bench train's table rows and the lines below it for runs that measured ``samples`` (samples/s per repeat
    of each (name, world size); None: that run failed), as `bench train` aggregates its launches."""
    from horovod_train.bench.runs import train as bench_train

    raw = [
        {"key": f"{name}-np{world}", "name": name, "engine": name.split("-")[0], "launcher": "x", "world_size": world,
         "ok": value is not None, "samples_per_second": value, "tokens_per_second": (value or 0) * 20,
         "wall_time_s": 3.0, "validation_accuracy": 0.5}
        for (name, world), values in samples.items() for value in values
    ]  # fmt: skip
    rows = bench_train.aggregate(raw)
    repeats = len(next(iter(samples.values())))
    lines = bench_train.report_lines(rows, bench_train.ratios(rows), bench_train.single_ratios(rows), repeats)
    return bench_train.table(rows)[1], lines


def test_bench_train_flags_a_ratio_above_what_its_runs_can_reach():
    """A load spike during the one single run (issue 38): efficiency 5.37 at np=1 and 12.690x at np=2 were printed
    as results. W ranks do at most W times one process's work: past that the baseline was slowed."""
    body, lines = bench_train_report(
        {("single", 1): [350.0], ("horovod-mpi", 1): [1880.0], ("horovod-mpi", 2): [4441.5], ("ddp-gloo", 2): [2000.0]}
    )
    assert [row[-1] for row in body] == ["1.00", "5.37?", "6.34?", "2.86?"]
    assert lines[0].startswith("? horovod-mpi np=1: efficiency 5.37 is no result: it is above the ideal 1x")
    assert "==> horovod-mpi np=2 / single np=1 samples/s: 12.690x is no result (it is above the ideal 2x" in lines[3]
    # The Horovod/DDP ratio does not divide by the slowed run: a result, though one run each cannot show its noise.
    assert lines[-1] == (
        "==> Horovod/DDP samples/s at np=2: 2.221x, horovod-mpi vs ddp-gloo (one run each: --repeats 3 shows their "
        "noise; wall-time speed ratio 1.000x)"
    )


def test_bench_train_flags_a_ratio_its_runs_noise_puts_on_both_sides_of_1():
    body, lines = bench_train_report(
        {
            ("single", 1): [1816.0, 1852.0, 1854.0],
            ("horovod-mpi", 2): [1000.0, 1500.0, 2000.0],
            ("ddp-gloo", 2): [1916.0, 1933.0, 1981.0],
        }  # fmt: skip
    )
    assert [row[-1] for row in body] == ["1.00", "0.40?", "0.52"]
    assert lines[-1].startswith(
        "==> Horovod/DDP samples/s at np=2: 0.776x is no result, horovod-mpi vs ddp-gloo (its runs' min..max put it "
        "anywhere in 0.505..1.044x, on both sides of 1"
    )
    resolved = bench_train_report(
        {
            ("single", 1): [1816.0, 1852.0, 1854.0],
            ("horovod-mpi", 2): [1986.0, 2119.0, 2165.0],
            ("ddp-gloo", 2): [1916.0, 1933.0, 1981.0],
        }  # fmt: skip
    )[1]
    assert resolved[-1] == (
        "==> Horovod/DDP samples/s at np=2: 1.096x, horovod-mpi vs ddp-gloo (1.003..1.130 over the runs' min..max, "
        "medians of 3; wall-time speed ratio 1.000x)"
    )
    assert not [line for line in resolved if "no result" in line]


def test_bench_train_takes_its_baseline_from_the_row_that_says_it_is_the_reference(monkeypatch):
    """The baseline run, the efficiencies' and the ratios' divisor and its line are the reference row's (another
    plain row made the reference here), not a name bench keeps."""
    import dataclasses

    from horovod_train.bench.runs.train import plan

    single = specs.ENGINES["single"]
    monkeypatch.setitem(specs.ENGINES, "single", dataclasses.replace(single, reference=False))
    solo = dataclasses.replace(single, name="solo", variants=specs.plain("solo"), reference=True)
    monkeypatch.setitem(specs.ENGINES, "solo", solo)
    assert [(r.name, r.engine, r.launcher, r.world_size) for r in plan([2], ["ddp"])][0] == ("solo", "solo", "plain", 1)
    body, lines = bench_train_report({("solo", 1): [1000.0], ("single", 1): [500.0], ("ddp-gloo", 2): [1500.0]})
    assert [row[-1] for row in body] == ["1.00", "0.50", "0.75"]
    assert lines[0].startswith("==> ddp-gloo np=2 / solo np=1 samples/s: 1.500x")


@pytest.mark.parametrize(
    ("samples", "why"),
    [
        ({("horovod-mpi", 2): [2000.0]}, "no ddp run"),
        ({("horovod-mpi", 2): [2000.0], ("ddp-gloo", 2): [None]}, "every run of ddp-gloo failed"),
        ({("horovod-mpi", 2): [None], ("ddp-gloo", 2): [1900.0]}, "every run of horovod-mpi failed"),
        ({("ddp-gloo", 2): [1900.0]}, "no horovod run"),
    ],
    ids=["ddp-not-run", "ddp-failed", "horovod-failed", "horovod-not-run"],
)
def test_bench_train_says_why_the_horovod_ddp_ratio_is_missing(samples, why):
    """The mission's line stays where one side of it was not run or failed, saying which, instead of vanishing."""
    body, lines = bench_train_report({("single", 1): [1000.0], **samples})
    assert lines[-1] == f"==> Horovod/DDP samples/s at np=2: no result: {why}", lines


def test_bench_train_says_when_its_baseline_measured_nothing():
    body, lines = bench_train_report({("single", 1): [None], ("horovod-mpi", 2): [2100.0], ("ddp-gloo", 2): [2000.0]})
    assert [row[-1] for row in body] == ["nan", "nan", "nan"]
    assert lines[0] == "? no single np=1 run measured: no efficiency or ratio to it (see its log)"
    assert lines[-1].startswith("==> Horovod/DDP samples/s at np=2: 1.050x, horovod-mpi vs ddp-gloo")


def _allreduce_rows(framework: str, latency_us: float, gbps: float, **settings) -> list[dict]:
    """`bench allreduce` rows of one framework whose single tensors take latency + bytes / bandwidth."""
    rows = [
        {
            "framework": framework,
            "kind": "tensor",
            "mode": "single",
            "case": f"{kib}KB",
            "bytes": kib * 1024,
            "time_us": latency_us + kib * 1024 / (gbps * 1e3),
            **settings,
        }
        for kib in (4, 64, 1024, 16384)
    ]
    return rows


def test_bench_allreduce_ends_with_ratios_and_the_largest_gaps_reason():
    """The table had no conclusion (issue 58): ratios per size, then whether the largest gap is the fixed cost of a
    call or the bandwidth, read off a latency + bytes/bandwidth line through each framework's times."""
    from horovod_train.bench.communication.allreduce import conclusion

    torch_rows = _allreduce_rows("torch", 300.0, 1.0)
    latency = conclusion([*_allreduce_rows("horovod", 4300.0, 1.0, cycle_time_ms=1.0), *torch_rows])
    assert latency[0].startswith("==> Horovod/torch time, one tensor (>1: Horovod slower): 4KB 14.15x, 64KB 11.94x, ")
    assert latency[1] == "==> largest gap: 4KB (tensor), horovod 4304 us vs torch 304 us (14.15x)"
    assert latency[2].startswith("==> why: latency-bound: fixed cost per call 4300 us vs 300 us, bandwidth 1.00 vs")
    assert latency[2].endswith("at 4KB 4000 us of the gap is the fixed cost, 4.0x HOROVOD_CYCLE_TIME (1 ms): each "
                               "request waits for the background thread's next cycle and the ranks' negotiation "
                               "before it is reduced")  # fmt: skip
    bandwidth = conclusion([*_allreduce_rows("horovod", 300.0, 0.25, cycle_time_ms=1.0), *torch_rows])
    assert bandwidth[1].startswith("==> largest gap: 16384KB (tensor), horovod 67409 us vs torch 17077 us")
    assert bandwidth[2].startswith("==> why: bandwidth-bound: fixed cost per call 300 us vs 300 us, bandwidth 0.25")


def test_bench_allreduce_says_why_where_small_tensors_times_do_not_grow_with_their_size():
    """CI's sweep on a loaded machine: Horovod's 4 KB call took 18.5 ms, its 16 KB one 1 ms (the smallest tensor's
    time was mostly its wait for a cycle). A line through the smallest and largest sizes then fell with the size and
    the reason line was left out; such times are all fixed cost, and the gap is said to be latency-bound."""
    from horovod_train.bench.communication.allreduce import conclusion

    sizes = {"4KB": (4096, 18533.0, 418.0), "8KB": (8192, 5500.0, 415.0), "16KB": (16384, 1030.0, 419.0)}
    rows = [
        {"framework": framework, "kind": "tensor", "mode": "single", "case": case, "bytes": nbytes, "time_us": t}
        for case, (nbytes, horovod_us, torch_us) in sizes.items()
        for framework, t in (("horovod", horovod_us), ("torch", torch_us))
    ]
    lines = conclusion(rows)
    assert lines[1] == "==> largest gap: 4KB (tensor), horovod 18533 us vs torch 418 us (44.34x)"
    assert lines[2].startswith("==> why: latency-bound: fixed cost per call 8354 us vs "), lines


def test_bench_reads_who_holds_the_whole_state_and_the_reference_from_the_rows_memory_parts(monkeypatch):
    """fit's engines are the rows whose memory part holds the whole state on every rank, bench gpu's reference the
    row that says it is the reference: a new row is counted by its part, not by its name."""
    from dataclasses import replace

    from horovod_train.bench.engine_names import reference_engine, whole_state_engines
    from horovod_train.engines import specs
    from horovod_train.engines.memory import FullySharded, FusionBuffered

    assert whole_state_engines() == ("horovod", "ddp", "single", "dp") and reference_engine() == "single"
    monkeypatch.setitem(specs.ENGINES, "toy", replace(specs.ENGINES["single"], name="toy", memory=FullySharded))
    assert "toy" not in whole_state_engines()
    monkeypatch.setitem(specs.ENGINES, "toy", replace(specs.ENGINES["fsdp"], name="toy", memory=FusionBuffered))
    assert whole_state_engines()[-1] == "toy"
    monkeypatch.setitem(specs.ENGINES, "single", replace(specs.ENGINES["single"], reference=False))
    with pytest.raises(LookupError, match="says it is the reference"):
        reference_engine()


def test_bench_names_engines_through_the_engine_table():
    """The engines bench names (fit's rows, bench gpu's contenders, project's settings) are rows of the engine
    table, read through bench/engine_names.py: the whole table in its order, or those named in the order given,
    and a name the table does not hold is refused where bench names it."""
    from horovod_train.bench.engine_names import engine_names
    from horovod_train.engines.specs import ENGINES

    assert engine_names() == tuple(ENGINES)
    assert engine_names("single", "horovod") == ("single", "horovod")
    with pytest.raises(LookupError, match="'deepspeed'"):
        engine_names("ddp", "deepspeed")
