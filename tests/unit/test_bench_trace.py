"""bench trace's arithmetic: interval unions, a step's split from profiler events, Horovod timeline steps.
(tests/integration/test_bench.py runs it on real ranks.)"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from horovod_train.bench.runs.trace import MAIN_PARTS, middle_half_mean, read_timeline, timeline_steps
from horovod_train.bench.runs.traced import PARTS, step_breakdown, union_ms
from horovod_train.training import phases

intervals = st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50)).map(lambda t: (t[0], t[0] + t[1])), max_size=12)


@given(intervals)
def test_union_of_intervals_is_the_covered_length(spans):
    covered = {us for start, end in spans for us in range(start, end)}  # unit cells [us, us + 1)
    assert union_ms([(float(a), float(b)) for a, b in spans]) == pytest.approx(len(covered) / 1000)


def test_a_step_splits_into_parts_that_add_up_to_it():
    spans = [  # (name, start, end) in seconds, as phases.span records them
        (phases.FORWARD, 0.001, 0.021),
        (phases.BACKWARD, 0.021, 0.061),
        (phases.GRADIENT_WAIT, 0.061, 0.080),
        (phases.OPTIMIZER, 0.061, 0.099),
        (phases.STEP, 0.0, 0.100),
        (phases.FORWARD, 0.150, 0.170),  # between steps (an evaluation's): no step's
        (phases.FORWARD, 0.200, 0.205),
        (phases.BACKWARD, 0.205, 0.215),  # runs past its step's end: clipped to 0.210
        (phases.STEP, 0.200, 0.210),
    ]
    first, second = step_breakdown(spans)
    assert first == pytest.approx(
        {"step": 100, "forward": 20, "backward": 40, "gradient_wait": 19, "optimizer": 38 - 19, "other": 2}
    )
    assert second == pytest.approx(
        {"step": 10, "forward": 5, "backward": 5, "gradient_wait": 0, "optimizer": 0, "other": 0}
    )
    for row in (first, second):
        assert sum(row[p] for p in PARTS) + row["other"] == pytest.approx(row["step"])
    assert step_breakdown([(phases.FORWARD, 0.0, 1.0)]) == []


def timeline_events(rows: dict[int, list[tuple[str, int, int]]], names: dict[int, str] | None = None) -> list[dict]:
    """Chrome trace B/E pairs per tensor row (pid), activities nested as Horovod writes them."""
    events = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": n}} for pid, n in (names or {}).items()]
    for pid, activities in rows.items():
        for name, start, end in activities:
            events += [{"ph": "B", "name": name, "ts": start, "pid": pid}, {"ph": "E", "ts": end, "pid": pid}]
    return sorted(events, key=lambda e: e.get("ts", -1))  # metadata first; stable: a B before the E at the same time


def fused_step(t0: int) -> list[tuple[str, int, int]]:
    return [
        ("NEGOTIATE_ALLREDUCE", t0, t0 + 100),
        ("ALLREDUCE", t0 + 100, t0 + 1000),
        ("MEMCPY_IN_FUSION_BUFFER", t0 + 110, t0 + 200),
        ("GLOO_ALLREDUCE", t0 + 200, t0 + 900),
        ("MEMCPY_OUT_FUSION_BUFFER", t0 + 900, t0 + 990),
    ]


# A step: its parts (forward, backward, gradient wait, optimizer) in ms, and what is left over of it.
steps_of_a_run = st.lists(st.lists(st.floats(0, 50), min_size=len(PARTS) + 1, max_size=len(PARTS) + 1), min_size=1,
                          max_size=16)  # fmt: skip


@given(steps_of_a_run)
def test_the_summary_of_a_run_adds_up_to_its_step(values):
    """As in each step, the summarized parts add up to the summarized step (a median part by part did not: the
    sum of the medians exceeded the median step, a red CI), and the slowest quarter of steps is left out."""
    steps = []
    for *parts, other in values:
        step = dict(zip(PARTS, parts, strict=True))
        steps.append(step | {"other": other, "step": sum(parts) + other})
    summary = middle_half_mean(steps)
    assert set(summary) == set(MAIN_PARTS)
    assert sum(summary[p] for p in PARTS) + summary["other"] == pytest.approx(summary["step"], rel=1e-9, abs=1e-9)
    assert summary["other"] >= -1e-9
    lengths = sorted(s["step"] for s in steps)
    assert lengths[0] - 1e-9 <= summary["step"] <= lengths[-1] + 1e-9
    if len(steps) >= 4:  # a step slower than every other does not move it
        slow = steps + [{p: 1e6 for p in PARTS} | {"other": 0.0, "step": 4e6}]
        assert middle_half_mean(slow)["step"] <= lengths[-1] + 1e-9


def test_timeline_steps_take_the_kth_all_reduce_of_every_gradient():
    steps = [fused_step(0), fused_step(10_000)]
    metric = [("NEGOTIATE_ALLREDUCE", 1000, 8000), ("ALLREDUCE", 8000, 9000), ("GLOO_ALLREDUCE", 8000, 9000)]
    rows = {
        1: steps[0] + steps[1],  # two tensors fused: the same times, counted once
        2: steps[0] + steps[1],
        3: [("ALLREDUCE", 5000, 9000), ("GLOO_ALLREDUCE", 5000, 9000)],  # all-reduced once: not a gradient
        4: [("BROADCAST", 0, 50_000)],
        5: metric * 2,  # the trainer's metrics, once per step too, but by name not a gradient
        6: metric * 2,
    }
    names = {1: "grouped_allreduce.a_1of2", 2: "grouped_allreduce.b_2of2", 3: "allreduce.c",
             5: "allreduce.horovod_train.all_reduce_sum_async", 6: "allreduce.noname.300"}  # fmt: skip
    found = timeline_steps(timeline_events(rows, names), steps=2)
    expected = {"allreduce": 0.9, "memcpy_in": 0.09, "transfer": 0.7, "memcpy_out": 0.09, "negotiate": 0.1}
    assert found == [pytest.approx(expected), pytest.approx(expected)]


def test_a_timeline_cut_short_still_reads(tmp_path):
    events = timeline_events({1: fused_step(0)})
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",".join(json.dumps(e) for e in events) + ",")  # as a killed rank leaves it
    assert read_timeline(path) == events
    path.write_text(json.dumps(events))
    assert read_timeline(path) == events
