"""Measure reading a large training file on 2 ranks: peak RSS per rank, seconds to the first optimizer step,
and the cache size. Run from a checkout (its horovod_train is measured):

    python scripts/measure_data_files.py --rows 2000000 --work /tmp/measure [--extra --preprocessing_num_workers 2]

One run = `horovodrun -np 2 --gloo` of tiny-bert with --max_steps 1 --logging_steps 1 on a fresh cache (with
--warm, again on the filled cache), each rank under /usr/bin/time -v. The tokenizer is a saved one (not tiny-bert's
own, which trains on every text of the data on each run and would dominate both)."""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from horovod_train.data import synthetic
from horovod_train.models.model import prepare_tiny_tokenizer, tiny_tokenizer_dir


def write_csv(path: Path, rows: int) -> None:
    if path.is_file():
        return
    block = synthetic.generate(10_000, seed=0)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["premise", "hypothesis", "label"])
        for i in range(rows):
            row = block[i % len(block)]
            writer.writerow([f"{row['premise']} {i}", row["hypothesis"], row["label"]])


def tokenizer(work: Path) -> Path:
    texts = [t for row in synthetic.generate(2000, seed=1) for t in (row["premise"], row["hypothesis"])]
    target = tiny_tokenizer_dir(work, texts)
    prepare_tiny_tokenizer(target, texts)
    return target


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def one_run(train: Path, tok: Path, cache: Path, out: Path, extra: list[str]) -> dict:
    bin_dir = Path(sys.executable).parent
    train_cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "horovod_train", "train", "--model_name_or_path",
                 "tiny-bert", "--tokenizer_name", str(tok), "--train_file", str(train), "--max_steps", "1",
                 "--logging_steps", "1", "--max_eval_samples", "64", "--per_device_train_batch_size", "16",
                 "--output_dir", str(out), "--overwrite_output_dir", "--disable_tqdm", *extra]  # fmt: skip
    cmd = [str(bin_dir / "horovodrun"), "-np", "2", "--gloo", *train_cmd]
    env = {**os.environ, "HOROVOD_TRAIN_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    started, first_step = time.perf_counter(), None
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if first_step is None and re.search(r"step 1/1 ", line):
            first_step = time.perf_counter() - started
    proc.wait()
    total = time.perf_counter() - started
    text = "".join(lines)
    if proc.returncode:
        raise SystemExit(f"exit {proc.returncode}:\n{text[-4000:]}")
    rss = [int(kb) / 2**20 for kb in re.findall(r"Maximum resident set size \(kbytes\): (\d+)", text)]
    return {"first_step_s": first_step, "total_s": total, "peak_rss_gib": rss,
            "cache_files_mib": du(cache / "files") / 2**20, "cache_tokenized_mib": du(cache / "tokenized") / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/measure-data-files"))
    parser.add_argument("--label", default="run")
    parser.add_argument("--warm", action="store_true", help="also a second run, on the filled cache")
    parser.add_argument("--cached", action="store_true", help="keep the cache of an earlier run of --label")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[])
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    train = args.work / f"train-{args.rows}.csv"
    write_csv(train, args.rows)
    tok = tokenizer(args.work)
    cache = args.work / f"cache-{args.label}"
    if not args.cached:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{train} {train.stat().st_size / 2**20:.0f} MiB, {args.rows} rows", flush=True)
    states = ("warm cache",) if args.cached else ("cold cache", "warm cache")[: 2 if args.warm else 1]
    for state in states:
        result = one_run(train, tok, cache, args.work / f"out-{args.label}", args.extra)
        print(f"{args.label} {state}: {result}", flush=True)


if __name__ == "__main__":
    main()
