"""`horovod-train bench memory`: full fine-tuning, gradient checkpointing and LoRA, side by side.

Per architecture (BERT-base; a Llama-style decoder of 0.5B parameters; both random init through
`--config_name`) and mode, one `train` run per engine at np=2 (through the launchers `bench train` uses)
gives samples/s and every rank's peak RSS (VmHWM, as the run reports it); the bytes all-reduced per
optimizer step are the trainable parameters' gradients (float32), counted on the run's saved architecture.
A mode whose parameter state would not fit in the memory available now is not run: its peak is computed
from a measured mode (fit.py's formula) and marked so. Activations are measured in-process (``fit.saved_bytes``
on one- and two-layer models of each shape), and feed the table of the largest model one 80 GB GPU fits.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horovod_train.bench import architectures, outputs, units
from horovod_train.bench.engine_names import memory_of, process_per_rank
from horovod_train.bench.models import fit
from horovod_train.common.errors import UsageError
from horovod_train.common.tables import format_table
from horovod_train.config import domains
from horovod_train.launching import compare
from horovod_train.outputs.run_directory import RunDirectory, claimed
from horovod_train.training.peak_memory import activation_bytes, largest_tensor, memory_available, node_bytes

ARCHITECTURES: dict[str, Callable[[], Any]] = {
    "bert-base": lambda: architectures.bert_config("bert-base-cased"),
    "decoder-0.5b": architectures.decoder_config,
}
DEFAULT_BATCH = {"bert-base": 8, "decoder-0.5b": 2}
MODE_FLAGS = {"lora": ["--use_peft"], "gc": ["--gradient_checkpointing"], "full": []}  # the order they run in
# Qwen2.5's published shapes (hidden, layers, MLP, heads, key/value heads, vocabulary; tied embeddings up to 3B):
# the family the fit table picks from, counted on the meta device.
QWEN25 = {
    "Qwen2.5-0.5B": (896, 24, 4864, 14, 2, 151936, True),
    "Qwen2.5-1.5B": (1536, 28, 8960, 12, 2, 151936, True),
    "Qwen2.5-3B": (2048, 36, 11008, 16, 2, 151936, True),
    "Qwen2.5-7B": (3584, 28, 18944, 28, 4, 152064, False),
    "Qwen2.5-14B": (5120, 48, 13824, 40, 8, 152064, False),
    "Qwen2.5-32B": (5120, 64, 27648, 40, 8, 152064, False),
    "Qwen2.5-72B": (8192, 80, 29568, 64, 8, 152064, False),
}
RUN_COLUMNS = ["architecture", "mode", "run", "world_size", "batch", "seq", "params", "trainable",
               "allreduce_bytes", "samples_per_second", "peak_rss_mib_per_rank", "status"]  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--architectures", nargs="+", default=list(ARCHITECTURES), choices=list(ARCHITECTURES))
    parser.add_argument("--modes", nargs="+", default=list(MODE_FLAGS), choices=list(MODE_FLAGS))
    parser.add_argument("--engines", nargs="+", default=["horovod-gloo"], help="runs, as bench train names them")
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--batch_sizes", nargs="+", type=int, default=None,
                        help="per-rank batch per architecture, in order (default: 8 and 2)")  # fmt: skip
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_steps", type=int, default=6, help="optimizer steps per run (median of their speeds)")
    parser.add_argument("--lora_r", type=int, default=8)
    parser.add_argument("--bf16", action="store_true", help="train in bf16 (fsdp: bf16 parameters, fp32 reduction)")
    parser.add_argument("--activation_seqs", nargs="+", type=int, default=[128, 512])
    parser.add_argument("--fit_batch", type=int, default=8, help="sequences per GPU in the fit table")
    parser.add_argument("--margin_gb", type=float, default=2.0, help="memory left free when deciding to run a mode")
    parser.add_argument("--no_runs", action="store_true", help="measure activations and print the fit table only")
    parser.add_argument("--output_dir", default="runs/bench/memory")
    parser.add_argument("--overwrite_output_dir", action="store_true")


def validate(args: argparse.Namespace) -> tuple[list[compare.Run], dict[str, int]]:
    """Every argument against its domain before anything is built, launched or written."""
    domains.writable_dir("output_dir", args.output_dir)
    for name in ("world_size", "max_seq_length", "lora_r", "fit_batch"):
        domains.count(1, example="8")(name, getattr(args, name))
    domains.Number(0.0, example="2")("margin_gb", args.margin_gb)
    if args.max_steps < 2:
        raise UsageError(f"--max_steps must be >= 2 (got {args.max_steps})", "pass --max_steps 6: speeds need steps")
    if min(args.activation_seqs) < 1 or max(args.activation_seqs) > 512:
        raise UsageError(f"--activation_seqs {args.activation_seqs}: out of 1..512", "pass e.g. 128 512")
    batches = args.batch_sizes or [DEFAULT_BATCH[a] for a in args.architectures]
    if len(batches) != len(args.architectures) or min(batches) < 1:
        raise UsageError(f"--batch_sizes {batches}: one size >= 1 per architecture", "pass e.g. --batch_sizes 8 2")
    runs = [] if args.no_runs else compare.select_runs(compare.supported_runs(args.world_size), args.engines)
    shared = [r.engine for r in runs if not process_per_rank(r.engine)]  # one process, every replica
    if shared:
        raise UsageError(f"bench memory measures one process per rank: not {shared[0]}",
                         f"drop {shared[0]}'s runs from --engines")  # fmt: skip
    return runs, dict(zip(args.architectures, batches, strict=True))


def build_on_meta(config: Any, mode: str, lora_r: int = 8) -> Any:
    """The model `train` builds from ``config`` (LoRA-wrapped in mode lora), on the meta device: no memory."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from horovod_train.models import lora

    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)
        return lora.wrap(model, lora.LoraOptions(r=lora_r)) if mode == "lora" else model


def count(config: Any, mode: str, lora_r: int = 8) -> tuple[int, list[int]]:
    """(parameters, bytes of each gradient the engine all-reduces per optimizer step: the trainable ones)."""
    return count_built(build_on_meta(config, mode, lora_r))


def count_built(model: Any) -> tuple[int, list[int]]:
    params = list(model.parameters())
    return sum(p.numel() for p in params), [p.numel() * p.element_size() for p in params if p.requires_grad]


def describe(name: str, config: Any, lora_r: int = 8) -> fit.Model:
    full = build_on_meta(config, "full")  # built once: its parameters and its largest tensor
    params, _ = count_built(full)
    _, lora_grads = count(config, "lora", lora_r)
    trainable = sum(lora_grads) // fit.GRAD_BYTES
    return fit.Model(name, params, config.hidden_size, config.num_hidden_layers, trainable, largest_tensor(full))


def qwen25_models(lora_r: int = 8) -> list[fit.Model]:
    from transformers import Qwen2Config

    models = []
    for name, (hidden, layers, mlp, heads, kv, vocab, tied) in QWEN25.items():
        config = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=mlp, vocab_size=vocab,
                             num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied,
                             num_labels=3, pad_token_id=0)  # fmt: skip
        models.append(describe(name, config, lora_r))
    return models


def measure_activations(config: Any, seq: int, kind: str, lora_r: int = 8, batch: int = 1) -> fit.Activations:
    """Bytes saved for backward per sequence: one layer's (two-layer minus one-layer model) and the rest."""
    import copy

    import torch
    from transformers import AutoModelForSequenceClassification

    from horovod_train.models import lora

    saved = {}
    for layers in (1, 2):
        shaped = copy.deepcopy(config)
        shaped.num_hidden_layers = layers
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_config(shaped)
        model = lora.wrap(model, lora.LoraOptions(r=lora_r)) if kind == "lora" else model
        model.train()
        inputs = {"input_ids": torch.randint(3, shaped.vocab_size, (batch, seq)), "labels": torch.zeros(batch).long()}
        tensors = [*model.parameters(), *model.buffers()]
        saved[layers] = fit.saved_bytes(lambda m=model, x=inputs: m(**x).loss, exclude=tensors)
    layer = (saved[2] - saved[1]) / batch
    return fit.Activations(seq, config.hidden_size, layer, saved[1] / batch - layer)


def state_bytes(model: fit.Model, mode: str, run: compare.Run) -> float:
    """A rank's parameter state (weights, gradients, AdamW) as ``run``'s engine spreads it over its ranks."""
    return memory_of(run.engine).state_bytes(model.params, fit.trainable(model, mode), run.world_size)


def runnable(model: fit.Model, mode: str, run: compare.Run, margin_gb: float, activations: float = 0.0) -> bool:
    """Whether ``run``'s ranks fit in the memory free now, less ``margin_gb``: the peak the memory check before
    start counts (the engines' memory model: base, state, ``activations``, save gather)."""
    parts = memory_of(run.engine).peak_bytes(
        model.params, fit.trainable(model, mode), run.world_size, activations, largest=model.largest
    )
    return node_bytes(parts, run.world_size) + margin_gb * fit.GB <= memory_available()


def train_args(config_dir: Path, mode: str, batch: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    """`train`'s arguments: the architecture random-initialised on the tiny tokenizer, padded to the length."""
    return [
        "--model_name_or_path", "tiny-bert", "--config_name", str(config_dir),
        "--dataset_name", "synthetic-nli", "--synthetic_num_examples", "400", "--max_eval_samples", "8",
        "--max_seq_length", str(args.max_seq_length), "--pad_to_max_length",
        "--per_device_train_batch_size", str(batch), "--per_device_eval_batch_size", str(batch),
        "--max_steps", str(args.max_steps), "--logging_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
        "--lora_r", str(args.lora_r), *MODE_FLAGS[mode], *(["--bf16"] if args.bf16 else []),
        "--output_dir", str(run_dir),
    ]  # fmt: skip


def allreduce_bytes(run_dir: Path, mode: str, lora_r: int) -> tuple[int, int, int]:
    """(parameters, trainable, bytes all-reduced per step) of the architecture the run saved."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(run_dir)
    params, grads = count(config, mode, lora_r)
    return params, sum(grads) // fit.GRAD_BYTES, sum(grads)


def measured_row(run: compare.Run, summary: dict[str, Any], run_dir: Path, mode: str, lora_r: int) -> dict:
    if not summary["ok"]:
        return {"status": f"failed ({summary.get('error')}), see {summary['log']}"}
    params, trainable, nbytes = allreduce_bytes(run_dir, mode, lora_r)
    return {
        "params": params,
        "trainable": trainable,
        "allreduce_bytes": nbytes,
        "samples_per_second": summary["samples_per_second"],
        "peak_rss_mib_per_rank": [round(m) for m in summary["peak_memory_mb_per_rank"]],
        "status": "measured",
    }


def computed_row(model: fit.Model, mode: str, run: compare.Run, batch: int, act: fit.Activations,
                 reference: dict) -> dict[str, Any]:  # fmt: skip
    """A mode not run: a measured mode's peak RSS plus the formula's difference in state and activations."""
    ref_mode = reference["mode"]
    extra = (state_bytes(model, mode, run) + fit.activation_bytes(model, mode, batch, act)
             - state_bytes(model, ref_mode, run) - fit.activation_bytes(model, ref_mode, batch, act))  # fmt: skip
    trainable = fit.trainable(model, mode)
    return {
        "params": model.params,
        "trainable": trainable,
        "allreduce_bytes": trainable * fit.GRAD_BYTES,
        "samples_per_second": float("nan"),
        "peak_rss_mib_per_rank": [round(m + extra / 2**20) for m in reference["peak_rss_mib_per_rank"]],
        "status": f"computed from {ref_mode} (not enough free memory to run)",
    }


OUTPUTS = ["configs", "logs", "runs", *(f"{s}.{e}" for s in ("memory", "activations", "fit") for e in ("csv", "json"))]


def main(args: argparse.Namespace) -> int:
    runs, batches = validate(args)
    with claimed(args.output_dir, args.overwrite_output_dir, OUTPUTS) as out:
        return run_all(args, runs, batches, out)


def run_all(args: argparse.Namespace, runs: list[compare.Run], batches: dict[str, int], out: Path) -> int:
    configs = {name: ARCHITECTURES[name]() for name in args.architectures}
    acts = activations(configs, sorted({*args.activation_seqs, args.max_seq_length}), args.lora_r)
    rows = [] if args.no_runs else train_runs(args, runs, batches, configs, acts, out)
    if "decoder-0.5b" not in configs:  # the fit table scales the decoder's activations
        acts.update(activations({"decoder-0.5b": architectures.decoder_config()}, args.activation_seqs, args.lora_r))
    family = {(k, s): a for (arch, k, s), a in acts.items() if arch == "decoder-0.5b" and s in args.activation_seqs}
    fitted = fit.fit_rows(qwen25_models(args.lora_r), family, args.fit_batch)
    act_rows = [{"architecture": a, "kind": k, "seq": s, "layer_mib": v.layer / 2**20, "rest_mib": v.rest / 2**20,
                 "gc_kept_mib": s * v.hidden * fit.FP32 / 2**20} for (a, k, s), v in acts.items()]  # fmt: skip
    outputs.write_rows(out, "memory", RUN_COLUMNS, rows)
    outputs.write_rows(out, "activations", list(act_rows[0]), act_rows)
    outputs.write_rows(out, "fit", list(fitted[0]), fitted, reserve_gb=fit.DEFAULT_RESERVE / fit.GB)
    for lines in (run_table(rows), activation_table(act_rows), fit_table(fitted)):
        print("\n".join(lines) + "\n")
    print(f"wrote {out}/: memory, activations and fit (.csv, .json), one directory and log per run")
    return 0 if not any(r["status"].startswith("failed") for r in rows) else 1


def activations(configs: dict[str, Any], seqs: list[int], lora_r: int) -> dict[tuple[str, str, int], fit.Activations]:
    """Measured per (architecture, full|lora, sequence length), batch 1, in this process."""
    return {(name, kind, seq): measure_activations(config, seq, kind, lora_r)
            for name, config in configs.items() for kind in ("full", "lora") for seq in seqs}  # fmt: skip


def train_runs(args: argparse.Namespace, runs: list[compare.Run], batches: dict[str, int], configs: dict[str, Any],
               acts: dict, out: Path) -> list[dict[str, Any]]:  # fmt: skip
    rows: list[dict[str, Any]] = []
    for name, config in configs.items():
        config_dir = out / "configs" / name
        config.save_pretrained(config_dir)
        model, act = describe(name, config, args.lora_r), acts[(name, "full", args.max_seq_length)]
        for run in runs:
            for mode in args.modes:
                key = f"{name}-{mode}-{run.name}"
                head = {"architecture": name, "mode": mode, "run": run.name, "world_size": run.world_size,
                        "batch": batches[name], "seq": args.max_seq_length}  # fmt: skip
                print(f"{key}", end=" ", flush=True)
                acts_bytes = activation_bytes(config, batches[name], args.max_seq_length, mode == "gc")
                if runnable(model, mode, run, args.margin_gb, acts_bytes):
                    run_dir, log = out / "runs" / key, out / "logs" / f"{key}.log"
                    log.parent.mkdir(parents=True, exist_ok=True)
                    cmd = run.command(train_args(config_dir, mode, batches[name], args, run_dir))
                    summary = compare.summarize(run, RunDirectory(run_dir), compare.execute(cmd, log), log)
                    row = {**head, **measured_row(run, summary, run_dir, mode, args.lora_r)}
                else:
                    done = [r for r in rows if r["architecture"] == name and r["run"] == run.name
                            and r["status"] == "measured"]  # fmt: skip
                    reference = next((r for r in done if r["mode"] == "gc"), done[0] if done else None)
                    if reference is None:
                        row = {**head, "status": "skipped (not enough free memory, nothing measured to compute from)"}
                    else:
                        row = {**head, **computed_row(model, mode, run, batches[name], act, reference)}
                rows.append(row)
                print(row["status"], flush=True)
    return rows


def run_table(rows: list[dict[str, Any]]) -> list[str]:
    header = ["architecture", "mode", "run", "batch x seq", "params", "trainable", "all-reduced/step", "samples/s",
              "peak RSS MiB per rank", "status"]  # fmt: skip
    body = [
        [r["architecture"], r["mode"], r["run"], f"{r['batch']}x{r['seq']}", f"{r.get('params', 0) / 1e6:.1f}M",
         f"{r.get('trainable', 0) / 1e6:.3f}M", units.format_bytes(r.get("allreduce_bytes", 0)),
         f"{r.get('samples_per_second', float('nan')):.2f}",
         "/".join(str(m) for m in r.get("peak_rss_mib_per_rank", [])), r["status"]]
        for r in rows
    ]  # fmt: skip
    return format_table(header, body)


def activation_table(rows: list[dict[str, Any]]) -> list[str]:
    header = ["architecture", "kind", "seq", "per layer per sequence", "outside the layers", "gc: kept per layer"]
    body = [[r["architecture"], r["kind"], str(r["seq"]), f"{r['layer_mib']:.2f} MiB", f"{r['rest_mib']:.2f} MiB",
             f"{r['gc_kept_mib']:.2f} MiB"] for r in rows]  # fmt: skip
    return format_table(header, body)


def fit_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per sequence length and mode; per engine, the largest Qwen2.5 that fits and its peak."""
    header = ["seq", "mode", "state bytes/param", *fit.ENGINES]
    lines: dict[tuple[int, str], dict[str, str]] = {}
    for r in rows:
        cell = f"{r['largest']} ({r['peak_gb']:.0f} GB)" if r["params"] else "none"
        lines.setdefault((r["seq"], r["mode"]), {})[r["engine"]] = cell
    body = [[str(seq), mode, fit.BYTES_PER_PARAM[mode], *(cells[e] for e in fit.ENGINES)]
            for (seq, mode), cells in lines.items()]  # fmt: skip
    return format_table(header, body)
