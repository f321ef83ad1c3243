"""The scaling model of `bench project` (horovod_train/bench/project.py): its formulas on hand-computed cases,
the properties a step-time model must have, the published layer sizes, and the CLI's outputs. No launches."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest

from horovod_train.bench import layers, project
from horovod_train.bench.project import MB, Cluster, Link, Setting, Workload
from horovod_train.cli import main

PNG = b"\x89PNG\r\n\x1a\n"

NVLINK, ETHERNET = Link(100e9, 5e-6), Link(12.5e9, 10e-6)

CLUSTER = Cluster(8, NVLINK, ETHERNET)

SETTINGS = [Setting("horovod", "horovod", 128 * MB, cycle_time=1e-3), Setting("ddp", "ddp", 25 * MB)]

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


def test_link_fit_recovers_latency_and_bandwidth(tmp_path):
    link, n = Link(2.5e9, 40e-6), 2
    rows = [
        {"kind": "tensor", "world_size": n, "bytes": b, "time_us": 1e6 * project.ring_allreduce_time(b, n, link)}
        for b in (4096, 65536, 2**20, 2**24)
    ]
    path = tmp_path / "allreduce.json"
    path.write_text(json.dumps({"rows": rows}))
    fitted, world = project.fit_link(path)
    assert world == 2
    assert fitted.bandwidth == pytest.approx(link.bandwidth, rel=1e-6)
    assert fitted.latency == pytest.approx(link.latency, rel=1e-6)


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
    assert [r["world_size"] for r in report["rows"]] == worlds * 2
    assert {r["setting"] for r in report["rows"]} == {"horovod", "ddp"}
    assert report["workload"]["compute"] == pytest.approx(64 / 400) and len(report["published"]) == 3
    with (out / "project.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 2 * len(worlds)
    assert (out / "project.png").read_bytes()[:8] == PNG
    printed = capsys.readouterr().out
    assert "Horovod paper" in printed and "vgg-16" in printed


def test_cli_refuses_a_model_without_compute_time(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "project", "--model", "vgg-16", "--output_dir", str(tmp_path / "never")])
    assert exit_info.value.code == 2 and not (tmp_path / "never").exists()
