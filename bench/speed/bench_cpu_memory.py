"""Benchmark: peak memory and time of one GRPO update of the CPU demo (`make demo`), by trainer setting.

The demo (`cpu` preset: SmolLM2-135M-Instruct, micro batch 2, bf16 autocast on the CPU, sequences up
to 2048 tokens) peaked at 13.9 GiB resident on a 2-core machine: more than a 16 GB laptop has free.
This bench runs the same update (`PortableTrainer.train_step`, the embedded SmolLM2 weights, 2 groups
x 4 real ART trajectories of --seq-len tokens, a third prompt; bench_trainer's `groups_for`) once per
setting, each in its own process so that its peak resident memory (`ru_maxrss`) is its own, one warm-up step then --steps timed ones, and prints a table:

    .venv/bin/python bench/speed/bench_cpu_memory.py --out bench/results/cpu_memory.txt
    .venv/bin/python bench/speed/bench_cpu_memory.py --modes preset,checkpointing --seq-len 1024 --steps 1

Settings: `preset` (the cpu preset as it is), `checkpointing` (+ gradient checkpointing: each
layer's activations recomputed in the backward pass instead of kept), `micro1` (micro batch 1),
`micro1-checkpointing` (both).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = {"preset": {}, "checkpointing": {"gradient_checkpointing": True}, "micro1": {"micro_batch_size": 1},
         "micro1-checkpointing": {"micro_batch_size": 1, "gradient_checkpointing": True}}


def child(mode: str, seq_len: int, steps: int) -> dict:
    sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "speed")]
    from bench_trainer import groups_for

    from mcp_rl.runs.config import preset
    from mcp_rl.policies.local_policy import LocalPolicy, load_local_model
    from mcp_rl.training.portable import PortableTrainer

    t = preset("cpu").train
    settings = {"micro_batch_size": t.micro_batch_size, "gradient_checkpointing": t.gradient_checkpointing,
                **MODES[mode]}
    model, tok = load_local_model("smollm2")
    trainer = PortableTrainer(LocalPolicy(model, tok), learning_rate=t.learning_rate, lora_r=t.lora_r,
                              lora_alpha=t.lora_alpha, loss=t.loss, max_seq_len=max(t.max_seq_len, seq_len),
                              precision=t.precision, **settings)
    groups, length = groups_for(tok, seq_len, 8)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    trainer.train_step(groups)  # warm-up
    seconds = []
    for _ in range(steps):
        m = trainer.train_step(groups)
        assert m["updated"] == 1.0 and m["num_sequences"] == 8, m
        seconds.append(m["seconds"])
    return {"mode": mode, **settings, "precision": t.precision, "seq_len": length, "sequences": 8,
            "loaded_gib": before, "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "s_per_step": sum(seconds) / len(seconds), "loss": m["loss"]}


def table(rows: list[dict]) -> str:
    base = rows[0]
    out = ["| setting | micro batch | checkpointing | seq len | peak RSS GiB | after load GiB | s / step | time vs first |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['mode']} | {r['micro_batch_size']} | {r['gradient_checkpointing']} | {r['seq_len']} | "
                   f"{r['peak_gib']:.2f} | {r['loaded_gib']:.2f} | {r['s_per_step']:.1f} | "
                   f"{r['s_per_step'] / base['s_per_step']:.2f}x |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print("ROW " + json.dumps(child(a.child, a.seq_len, a.steps)), flush=True)
        return 0
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes) or a.seq_len < 64 or a.steps < 1:
        p.error(f"--modes from {', '.join(MODES)}; --seq-len >= 64; --steps >= 1")
    rows = []
    for mode in modes:
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--child", mode, "--seq-len", str(a.seq_len),
                               "--steps", str(a.steps)], capture_output=True, text=True)
        found = [line[4:] for line in proc.stdout.splitlines() if line.startswith("ROW ")]
        if proc.returncode or not found:
            print(f"{mode}: failed (exit {proc.returncode}): {proc.stderr[-1500:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(found[0]))
        print(f"{mode}: {time.perf_counter() - started:.0f} s", flush=True)
    head = (f"# CPU demo update memory, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
            f"{platform.machine()} {__import__('os').cpu_count()} cores; one process per setting, "
            f"{a.steps} timed step(s) after a warm-up")
    report = head + "\n\n" + table(rows) + "\n"
    print(report)
    if a.out:
        Path(a.out).write_text(report + "\n" + "\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
