"""The scaling model of `bench project` (horovod_train/bench/models/project.py): its formulas on hand-computed cases,
the properties a step-time model must have, the published layer sizes, and the CLI's outputs. No launches."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest

from horovod_train.bench.models import layers, project
from horovod_train.bench.models.project import MB, Cluster, Link, Setting, Workload
from horovod_train.cli.main import main
from horovod_train.engines import specs
from horovod_train.engines.communication import Buckets, FusionCycle, PerBlock

PNG = b"\x89PNG\r\n\x1a\n"

NVLINK, ETHERNET = Link(100e9, 5e-6), Link(12.5e9, 10e-6)

CLUSTER = Cluster(8, NVLINK, ETHERNET)

SETTINGS = [Setting("horovod", FusionCycle(), 128 * MB, cycle_time=1e-3), Setting("ddp", Buckets(), 25 * MB)]

WORLDS = project.world_sizes(1024, 8)


def workload(model: str, compute: float = 0.25, batch: int = 32) -> Workload:
    return Workload(model, tuple(4 * n for n in layers.parameter_counts(model)), compute, batch)


def test_ring_allreduce_matches_the_hand_computed_case():
    # 100 MB over 4 ranks at 10 GB/s, 5 us a step: 2*3/4 * 0.01 s + 6 * 5 us = 15.03 ms
    assert project.ring_allreduce_time(100e6, 4, Link(10e9, 5e-6)) == pytest.approx(0.01503, rel=1e-12)
    assert project.ring_allreduce_time(100e6, 1, Link(10e9, 5e-6)) == 0.0
    # hierarchical, 2 nodes x 4 GPUs: 2 x (3/4 * 100e6/100e9 + 3 * 5 us) + (2*1/2 * 100e6/12.5e9 + 2 * 10 us)
    expected = 2 * (0.75e-3 + 15e-6) + (8e-3 + 20e-6)
    assert project.hierarchical_allreduce_time(100e6, 2, 4, NVLINK, ETHERNET) == pytest.approx(expected, rel=1e-12)
    assert project.allreduce_time(100e6, 8, Cluster(4, NVLINK, ETHERNET)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("model", ["resnet-101", "vgg-16", "bert-base-cased"])
def test_efficiency_is_one_on_one_gpu_and_never_rises_beyond_one_node(model):
    rows = project.project(workload(model), SETTINGS, CLUSTER, WORLDS)
    for name in ("horovod", "ddp"):
        mine = [r for r in rows if r["setting"] == name]
        assert mine[0]["world_size"] == 1 and mine[0]["scaling_efficiency"] == 1.0
        assert mine[0]["exposed_comm_ms"] == 0.0 and mine[0]["comm_ms"] == 0.0
        beyond = [r["scaling_efficiency"] for r in mine if r["world_size"] >= CLUSTER.gpus_per_node]
        assert all(b <= a + 1e-12 for a, b in zip(beyond, beyond[1:], strict=False)), beyond
        assert all(0 < r["scaling_efficiency"] <= 1 for r in mine)
        for r in mine:  # samples/s is the efficiency times linear scaling, by definition
            assert r["samples_per_second"] == pytest.approx(
                r["scaling_efficiency"] * r["world_size"] * mine[0]["samples_per_second"]
            )
    assert [r["world_size"] for r in rows[: len(WORLDS)]] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def test_fsdp_and_zero1_match_the_hand_computed_case():
    """Two ranks, no latency, two tensors of S bytes with S/B = 20 ms: an all-gather or reduce-scatter of a unit
    takes 10 ms. 300 ms of compute, 2/3 backward: 50 ms forward and 100 ms backward per unit.
    fsdp: forward gathers unit 0 (0-10), computes it (10-60) while unit 1 is gathered (10-20), computes unit 1
    (60-110); backward gathers unit 1 (110-120), computes it (120-220) while unit 0 is gathered (120-130),
    reduce-scatters it (220-230), computes unit 0 (220-320), reduce-scatters it (320-330): 30 ms exposed.
    fsdp-zero2 keeps the gathered units: backward 110-210 and 210-310, the last reduce-scatter to 320: 20 ms.
    zero1: DDP's all-reduce of both (one 25 MB bucket at the end of backward: 40 ms) plus the all-gather of the
    updated parameters (20 ms) after the step."""
    link = Link(1e9, 0.0)
    work = Workload("two", (20_000_000, 20_000_000), 0.3, 8)
    cluster = Cluster(8, link, link)
    fsdp = Setting("fsdp", PerBlock(), 0, units=2)
    assert project.step(work, fsdp, 2, cluster)["exposed"] == pytest.approx(0.030)
    zero2 = replace(fsdp, communication=PerBlock(reshard=False))
    assert project.step(work, zero2, 2, cluster)["exposed"] == pytest.approx(0.020)
    assert project.step(work, fsdp, 2, cluster)["comm"] == pytest.approx(0.060)  # 3 x 2 units x 10 ms
    zero1 = project.step(work, Setting("zero1", Buckets(gather_after_step=True), 25 * MB), 2, cluster)
    assert zero1["exposed"] == pytest.approx(0.040 + 0.020) and zero1["comm"] == pytest.approx(0.060)
    assert project.step(work, fsdp, 1, cluster)["step"] == 0.3  # one rank: nothing to gather


@pytest.mark.parametrize("model", ["resnet-50", "bert-base-cased"])
def test_sharding_costs_half_an_allreduce_more_per_byte_and_zero2_none(model):
    """On links without latency (time in proportion to bytes), across 8 nodes: fsdp moves 1.5x DDP's bytes (an
    all-gather in forward and one in backward, a reduce-scatter: each half an all-reduce), fsdp-zero2 1x, zero1
    1.5x (DDP's all-reduce plus the all-gather of the updated parameters); without overlap all of it is exposed."""
    bandwidth_only = Cluster(8, Link(100e9, 0.0), Link(12.5e9, 0.0))
    work, fsdp = workload(model), Setting("fsdp", PerBlock(), 0, overlap=False)
    gathered = Buckets(gather_after_step=True)
    ddp = project.step(work, Setting("ddp", Buckets(), 25 * MB, overlap=False), 64, bandwidth_only)["comm"]
    sharded = {
        "fsdp": project.step(work, fsdp, 64, bandwidth_only),
        "fsdp-zero2": project.step(work, replace(fsdp, communication=PerBlock(reshard=False)), 64, bandwidth_only),
        "zero1": project.step(work, Setting("zero1", gathered, 25 * MB, overlap=False), 64, bandwidth_only),
    }
    assert {name: times["comm"] / ddp for name, times in sharded.items()} == pytest.approx(
        {"fsdp": 1.5, "fsdp-zero2": 1.0, "zero1": 1.5}
    )
    assert all(times["exposed"] == pytest.approx(times["comm"]) for times in sharded.values())


def test_units_are_contiguous_runs_of_about_equal_bytes():
    assert project.units((1, 1, 1, 1, 1, 1), 3) == [2, 2, 2]
    assert project.units((10, 1, 1, 1), 4) == [10, 1, 1, 1]
    assert project.units((5,), 12) == [5]
    sizes = tuple(4 * n for n in layers.parameter_counts("bert-base-cased"))
    assert sum(project.units(sizes, 12)) == sum(sizes) and len(project.units(sizes, 12)) == 12


def test_hierarchical_beats_a_flat_ring_only_when_the_network_is_the_slower_link():
    nbytes, world = 256e6, 64  # 8 nodes x 8 GPUs
    slow_network = Cluster(8, NVLINK, ETHERNET)
    flat = project.allreduce_time(nbytes, world, replace(slow_network, algorithm="ring"))
    hierarchical = project.allreduce_time(nbytes, world, replace(slow_network, algorithm="hierarchical"))
    assert hierarchical < flat
    assert project.algorithm_for(world, slow_network) == "hierarchical"
    # With the node's links no faster than the network, the two extra in-node phases cost more than they save.
    same = Cluster(8, Link(12.5e9, 0.0), Link(12.5e9, 0.0))
    assert project.allreduce_time(nbytes, world, replace(same, algorithm="hierarchical")) > project.allreduce_time(
        nbytes, world, replace(same, algorithm="ring")
    )


def test_a_step_with_and_without_overlap_matches_the_hand_computed_case():
    """4 gradients of 10 MB, backward the last 0.5 s of a 1 s step: ready at 0.125, 0.25, 0.375 and 0.5 s; 2 ranks
    on a 1 GB/s link without latency: an all-reduce of S bytes takes 2(2-1)/2 x S / 1e9 = S / 1e9 s.
    Horovod, 0.25 s cycles: 20 MB at 0.25 s (till 0.27), 20 MB at 0.5 s (till 0.52): 0.02 s exposed.
    DDP, 25 MiB buckets (26,214,400 bytes, closed once reached): 30 MB at 0.375 s (till 0.405), 10 MB at 0.5 s
    (till 0.51): 0.01 s exposed. Without overlap both send 40 MB from 0.5 s: 0.04 s exposed."""
    work = Workload("hand", (10_000_000,) * 4, compute=1.0, batch=8, backward_fraction=0.5)
    cluster = Cluster(8, Link(1e9, 0.0), Link(1e9, 0.0))
    cases = [
        (Setting("horovod", FusionCycle(), 128 * MB, cycle_time=0.25), 0.02),
        (Setting("ddp", Buckets(), 25 * MB), 0.01),
    ]
    for setting, exposed in cases:
        for overlap, expected in ((True, exposed), (False, 0.04)):
            times = project.step(work, replace(setting, overlap=overlap), 2, cluster)
            assert times == pytest.approx({"buckets": 2, "comm": 0.04, "exposed": expected, "step": 1 + expected})


def test_overlap_hides_communication_and_exposes_at_most_all_of_it():
    work = workload("bert-base-cased", compute=0.3)
    for setting in SETTINGS:
        for world in (16, 256):
            hidden = project.step(work, setting, world, CLUSTER)
            serial = project.step(work, replace(setting, overlap=False), world, CLUSTER)
            assert serial["exposed"] == pytest.approx(serial["comm"])  # nothing overlaps
            assert hidden["exposed"] <= serial["exposed"] and hidden["exposed"] <= hidden["comm"]
            assert hidden["step"] == pytest.approx(work.compute + hidden["exposed"])


def test_cnn_layer_lists_match_the_published_parameter_counts():
    assert sum(layers.vgg16()) == 138_357_544
    assert sum(layers.resnet((3, 4, 6, 3))) == 25_557_032
    assert sum(layers.resnet((3, 4, 23, 3))) == 44_549_160
    assert sum(layers.inception_v3()) == 23_817_352
    assert len(layers.vgg16()) == 32 and len(list(layers.inception_v3_convs())) == 94


def tensor_row(nbytes: int, time_us: float, world_size: int = 2) -> dict:
    return {"kind": "tensor", "world_size": world_size, "bytes": nbytes, "time_us": time_us}


def allreduce_json(path: Path, rows: list) -> Path:
    path.write_text(json.dumps({"rows": rows}))
    return path


@pytest.mark.parametrize(
    ("n", "microseconds"),
    [  # a link of 2.5 GB/s and 40 us a step: 2(n-1) x 40 us + 2(n-1)/n x bytes / 2.5e9 s, by hand
        (2, lambda nbytes: 80 + nbytes / 2500),
        (4, lambda nbytes: 240 + 1.5 * nbytes / 2500),
    ],
)
def test_link_fit_recovers_latency_and_bandwidth(tmp_path, n, microseconds):
    rows = [tensor_row(b, microseconds(b), n) for b in (4096, 65536, 2**20, 2**24)]
    rows.append(tensor_row(65536, microseconds(65536) + 50, n))  # a slower framework at one size: not the link's
    fitted, world = project.fit_link(allreduce_json(tmp_path / "allreduce.json", rows))
    assert world == n
    assert fitted.bandwidth == pytest.approx(2.5e9, rel=1e-6)
    assert fitted.latency == pytest.approx(40e-6, rel=1e-6)


LINK_BAD = {
    "one rank": ([tensor_row(4096, 10, 1), tensor_row(8192, 20, 1)], "was measured on 1 rank"),
    "one message size": ([tensor_row(4096, 10), tensor_row(4096, 12)], "times one message size (4KB)"),
    "larger is faster": (
        [tensor_row(4096, 30), tensor_row(8192, 20), tensor_row(16384, 10)],
        "would be negative",
    ),
    "flat times": ([tensor_row(4096, 30), tensor_row(8192, 30)], "would be infinite"),
    "no time_us": ([tensor_row(4096, 10), {"kind": "tensor", "world_size": 2, "bytes": 8192}], "has time_us None"),
    "no world_size": ([{"kind": "tensor", "bytes": 4096, "time_us": 10}], "row 1 has world_size None"),
    "text bytes": ([tensor_row("4KB", 10)], "row 1 has bytes '4KB'"),
    "several world sizes": ([tensor_row(4096, 10, 2), tensor_row(8192, 20, 4)], "mixes rows of 2 and 4 ranks"),
    "a row that is not an object": ([7, tensor_row(4096, 10)], "times one message size"),
}


@pytest.mark.parametrize("case", LINK_BAD)
def test_link_from_refuses_what_it_cannot_fit_in_one_line(tmp_path, capsys, case):
    rows, message = LINK_BAD[case]
    path, out = allreduce_json(tmp_path / "allreduce.json", rows), tmp_path / "never"
    args = ["--model", "resnet-50", "--samples_per_second_1gpu", "400", "--link_from", str(path)]
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "project", *args, "--output_dir", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "; fix: " in err[0], err
    assert not out.exists()


def test_published_horovod_runs_are_predicted_in_the_papers_order():
    rows = {r["model"]: r for r in project.check_published()}
    assert set(rows) == {"inception-v3", "resnet-101", "vgg-16"}
    assert rows["vgg-16"]["predicted"] < min(rows["inception-v3"]["predicted"], rows["resnet-101"]["predicted"])
    for r in rows.values():
        assert r["predicted_no_overlap"] < r["predicted"]
        assert r["error_points"] == pytest.approx(100 * (r["predicted"] - r["efficiency"]))


def test_cli_prints_and_writes_csv_json_and_png(tmp_path, capsys):
    out = tmp_path / "project"
    args = [
        "bench",
        "project",
        "--model",
        "resnet-50",
        "--samples_per_second_1gpu",
        "400",
        "--per_device_train_batch_size",
        "64",
    ]
    assert main([*args, "--gpus_per_node", "4", "--max_gpus", "64", "--check_published", "--output_dir", str(out)]) == 0
    report = json.loads((out / "project.json").read_text())
    worlds = [1, 2, 4, 8, 16, 32, 64]
    assert [r["world_size"] for r in report["rows"]] == worlds * 5
    # The rows' order (engines/specs.py), each engine's variants after it.
    assert [r["setting"] for r in report["rows"]][:: len(worlds)] == ["horovod", "ddp", "fsdp", "fsdp-zero2", "zero1"]
    assert report["workload"]["compute"] == pytest.approx(64 / 400) and len(report["published"]) == 3
    with (out / "project.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 5 * len(worlds)
    assert (out / "project.png").read_bytes()[:8] == PNG
    printed = capsys.readouterr().out
    assert "Horovod paper" in printed and "vgg-16" in printed


def test_a_row_with_a_communication_part_is_projected_as_that_part_schedules(tmp_path, monkeypatch):
    """bench project's settings are the rows': a new row with a known communication part is projected, with its
    variant whose train arguments change the part, as that part schedules (the same numbers as fsdp's and
    fsdp-zero2's rows); rows without one (single, dp) are not projected."""
    toy = specs.EngineSpec("toy", specs.ENGINES["fsdp"].engine, "torchrun",
                           specs.on_torchrun("toy", kept=("--fsdp_reshard_after_forward", "false")),
                           communication=PerBlock())  # fmt: skip
    monkeypatch.setitem(specs.ENGINES, "toy", toy)
    out = tmp_path / "project"
    args = ["bench", "project", "--model", "resnet-50", "--compute_ms", "100", "--max_gpus", "16"]
    assert main([*args, "--output_dir", str(out)]) == 0
    rows = json.loads((out / "project.json").read_text())["rows"]
    by_setting: dict[str, list[dict]] = {}
    for row in rows:
        by_setting.setdefault(row.pop("setting"), []).append(row)
    assert list(by_setting) == ["horovod", "ddp", "fsdp", "fsdp-zero2", "zero1", "toy", "toy-kept"]
    assert by_setting["toy"] == by_setting["fsdp"] and by_setting["toy-kept"] == by_setting["fsdp-zero2"]
    assert by_setting["fsdp"] != by_setting["fsdp-zero2"]


def test_cli_refuses_a_model_without_compute_time(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "project", "--model", "vgg-16", "--output_dir", str(tmp_path / "never")])
    assert exit_info.value.code == 2 and not (tmp_path / "never").exists()
