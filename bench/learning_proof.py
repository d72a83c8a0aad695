"""Learning proof: does GRPO teach SmolLM2-135M-Instruct to use the company MCP server?

One run of `mcp_rl.run` (base eval -> warm start -> eval -> GRPO steps -> eval), with
the real embedded weights, the portable trainer, the company server over streamable HTTP
(`server: company`) and verifiable rewards only (no judge). The held-out set is the test split
plus the validation split relabelled `test` (79 + 49 = 128 scenarios), written to
`<out>.scenarios.jsonl` from `cfg.scenarios`: the pipeline evaluates its `test` split, and 79
alone is too few to separate a 5-point gap. Training still draws only from the train split.

    python bench/learning_proof.py --config bench/learning_proof.yaml --out runs/lp --deadline-s 540
    python bench/learning_proof.py ... --set train.learning_rate=5.0e-5    # any config override
    python bench/learning_proof.py ... --random-weights TOKENIZER_DIR        # dress rehearsal, no weights

`--deadline-s` bounds the whole script (model load included): GRPO steps continue while one more
step plus the final evaluation still fit (`train.steps` is then an upper bound); `--train-budget-s`
caps the GRPO steps' total time (rollouts + updates) over the whole run. A device call lasts at
most 10 minutes, so one run can span two: `--pause` stops after the last step that fits, before
the final evaluation, and a second call with `--resume` continues from the step checkpoint
(LoRA weights and optimizer state) in the same run folder:

    python bench/learning_proof.py --out /tmp/lp --deadline-s 560 --pause
    python bench/learning_proof.py --out /tmp/lp --deadline-s 560 --resume
 Besides the
pipeline's report.md / eval_*.jsonl / metrics.jsonl / PNGs, it writes proof.json and proof.md:
the gaps final-base and final-warm_start with their standard errors, both unpaired (two
proportions) and paired (per-scenario differences on the same scenarios), against the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mcp_rl import distributed, parts, pipeline  # noqa: E402  (runs is imported in main: it brings ART, and ART transformers)
from mcp_rl.config import apply_overrides, load_config  # noqa: E402
from mcp_rl.scenarios import load_scenarios, save_scenarios  # noqa: E402

# SmolLM2-135M's shape (from its GGUF), for the random-weights dress rehearsal only.
SMOLLM2_SHAPE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                     rms_norm_eps=1e-5, tie_word_embeddings=True)
TINY_SHAPE = dict(SMOLLM2_SHAPE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)  # CPU tests of this script
TARGETS = {"base": 0.10, "warm_start": 0.05}  # final must beat each by this much, and by > 2 s.e.


def heldout_file(src: str, dst: Path) -> dict:
    """Write `src` with val relabelled test (tagged 'heldout:val'); returns the split counts."""
    out, counts = [], {}
    for s in load_scenarios(src):
        if s.split == "val":
            s.split, s.tags = "test", [*s.tags, "heldout:val"]
        counts[s.split] = counts.get(s.split, 0) + 1
        out.append(s)
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_scenarios(dst, out)
    return counts


def build_trainer(cfg, *, max_batch: int, batch_wait_s: float, random_weights: str | None, shape: str = "smollm2",
                  batch_gap_s: float | None = None):
    """parts.build_trainer, with a LocalPolicy batch as wide as the rollout concurrency.

    The library's LocalPolicy batches at most 8 requests per generate, after waiting 20 ms for
    them, and the config has no field for either. On a GPU a whole step's rollouts fit one
    batch, and a longer wait lets the rollouts that are still in a tool call join the next turn's
    batch instead of forcing a second generate (a generate costs seconds, the wait does not)."""
    import torch

    from mcp_rl.local_policy import LocalPolicy, load_local_model, load_local_tokenizer
    from mcp_rl.train import PortableTrainer

    if random_weights:
        from transformers import LlamaConfig, LlamaForCausalLM

        tok = load_local_tokenizer(random_weights)
        tok.eos_token = "<|im_end|>"
        config = LlamaConfig(vocab_size=len(tok), bos_token_id=1, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.eos_token_id, **(TINY_SHAPE if shape == "tiny" else SMOLLM2_SHAPE))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    elif cfg.train.loader == "unsloth":  # Unsloth's model (4-bit with load_in_4bit), LoRA and sampler: the library's build
        trainer = parts.build_trainer(cfg)
        trainer.policy.max_batch, trainer.policy.batch_wait_s = max_batch, batch_wait_s
        trainer.policy.batch_gap_s = batch_gap_s
        return trainer
    else:  # float16 weights where training runs in float16 (a T4, or forced), as parts.build_trainer loads them
        model, tok = load_local_model(cfg.model, quantize_4bit=cfg.load_in_4bit,
                                      dtype="float16" if cfg.train.precision == "fp16" else None)
    t = cfg.train
    policy = LocalPolicy(model, tok, name=Path(cfg.out).name, tool_prefix=cfg.tool_prefix, max_batch=max_batch,
                         batch_wait_s=batch_wait_s, batch_gap_s=batch_gap_s)
    return PortableTrainer(policy, learning_rate=t.learning_rate, lora_r=t.lora_r, lora_alpha=t.lora_alpha,
                           loss=t.loss, micro_batch_size=t.micro_batch_size, max_seq_len=t.max_seq_len, precision=t.precision,
                           micro_batch_tokens=t.micro_batch_tokens)


class Paused(Exception):
    """Raised instead of the final evaluation when `--pause` ends this call's share of the run."""


def install_deadline(cfg, start: float, deadline_s: float, timings: dict, *, pause: bool = False,
                     train_budget_s: float = float("inf"), trained_s: float = 0.0) -> None:
    """Time evaluations and steps; stop stepping when a step plus the final eval would not fit.

    Works through the pipeline's public module functions (train_loop calls `pipeline.train_step`
    and re-reads `cfg.train.steps` before every step); the library has no time-budget option.
    `trained_s`: GRPO seconds already spent by earlier calls of this run (their metrics.jsonl)."""
    evaluate_policy, train_step = pipeline.evaluate_policy, pipeline.train_step
    paused = {"at": None}

    async def timed_eval(*args, **kwargs):
        label = kwargs.get("label", args[4] if len(args) > 4 else "?")
        if label == "trained" and paused["at"] is not None:
            raise Paused(f"paused after step {paused['at']}: resume with --resume")
        t0 = time.monotonic()
        result = await evaluate_policy(*args, **kwargs)
        timings.setdefault("eval_s", {})[label] = time.monotonic() - t0
        return result

    async def budgeted_step(trainer, server, batch, cfg_, step):
        rec = await train_step(trainer, server, batch, cfg_, step)
        timings.setdefault("step_s", []).append(rec["seconds"])
        evals = timings.get("eval_s", {})
        final_eval = 1.5 * max(evals.values(), default=60.0) + 20.0  # RL rollouts can get longer; plus the report
        left = deadline_s - (time.monotonic() - start)
        # a step, plus the held-out curve's evaluation that may follow it (train.eval_every)
        longest = max(timings["step_s"]) * 1.1 + max((v for k, v in evals.items() if "_step" in k), default=0.0)
        spent = trained_s + sum(timings["step_s"])
        if spent + longest > train_budget_s and cfg_.train.steps > step + 1:
            print(f"training budget: {spent:.0f} of {train_budget_s:.0f} s spent: stopping after step {step + 1}",
                  flush=True)
            cfg_.train.steps = step + 1
        elif left < longest + (0 if pause else final_eval) and cfg_.train.steps > step + 1:
            print(f"deadline: {left:.0f} s left, a step takes up to {longest:.0f} s and the "
                  f"final eval ~{final_eval:.0f} s: stopping after step {step + 1}", flush=True)
            cfg_.train.steps = step + 1
            paused["at"] = step + 1 if pause else None
        # Under torchrun only rank 0 evaluates and times the evaluations: its decision holds on every rank.
        cfg_.train.steps = distributed.broadcast_object(cfg_.train.steps, f"step budget after step {step + 1}")
        return rec

    pipeline.evaluate_policy, pipeline.train_step = timed_eval, budgeted_step


def compare(final: list[dict], other: list[dict], min_gap: float) -> dict:
    """Gap in grounded success@1 (right, with evidence: what the reward pays) on the same scenarios, with
    unpaired and paired standard errors; rows saved before the grounding rule count by `verified`."""
    ok = lambda rows: {r["scenario_id"]: float(r.get("grounded", r["verified"]) >= 0.999) for r in rows}  # noqa: E731
    a, b = ok(final), ok(other)
    ids = sorted(set(a) & set(b))
    n = len(ids)
    pa, pb = sum(a[i] for i in ids) / n, sum(b[i] for i in ids) / n
    se_unpaired = math.sqrt(pa * (1 - pa) / n + pb * (1 - pb) / n)
    d = [a[i] - b[i] for i in ids]
    mean = sum(d) / n
    se_paired = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n) if n > 1 else float("nan")
    gap = pa - pb
    return {"n": n, "final": pa, "other": pb, "gap": gap, "se_unpaired": se_unpaired, "se_paired": se_paired,
            "wins": sum(x > 0 for x in d), "losses": sum(x < 0 for x in d), "target_gap": min_gap,
            "meets_gap": gap >= min_gap - 1e-9,
            "meets_2se_unpaired": gap > 2 * se_unpaired, "meets_2se_paired": gap > 2 * se_paired}


def held_out_curve(rows: dict, periodic: dict[int, list[dict]], steps: int) -> list[dict]:
    """Held-out success by GRPO step: the warm start (step 0), every periodic evaluation, the final one.

    Every point counts only the scenarios all periodic evaluations share (the first
    `train.eval_every_scenarios` held-out ones), so the curve compares like with like; the full
    held-out set is in the comparisons."""
    rate = lambda rs: sum(r.get("grounded", r["verified"]) >= 0.999 for r in rs) / max(len(rs), 1)  # noqa: E731
    ids = set.intersection(*({r["scenario_id"] for r in rs} for rs in periodic.values())) if periodic else None

    def point(step: int, label: str, rs: list[dict]) -> dict:
        rs = [r for r in rs if ids is None or r["scenario_id"] in ids]
        return {"step": step, "success": rate(rs), "n": len(rs), "label": label}

    curve = [point(0, "warm_start", rows["warm_start"])] if "warm_start" in rows else []
    # The final policy is evaluated below: a periodic evaluation at the last step would be a second copy.
    curve += [point(k, f"test_step{k}", rs) for k, rs in sorted(periodic.items()) if k != steps or "trained" not in rows]
    if "trained" in rows:
        curve.append(point(steps, "trained", rows["trained"]))
    return curve


def plot_curve(run_dir: Path, curve: list[dict], history: list[dict]) -> None:
    """curve.png: held-out success and training-rollout success by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h for h in history if "reward_mean" in h]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([c["step"] for c in curve], [c["success"] for c in curve], marker="o", label="held-out (greedy)")
    ax.plot([h["step"] for h in steps], [h.get("grounded_rate", h["success_rate"]) for h in steps], alpha=0.5,
            label="training rollouts")
    ax.set_xlabel("GRPO step"), ax.set_ylabel("grounded success"), ax.legend(), ax.set_title(run_dir.name)
    fig.tight_layout(), fig.savefig(run_dir / "curve.png", dpi=110), plt.close(fig)


def proof_tables(run_dir: Path, timings: dict, history: list[dict], targets: dict | None = None) -> dict:
    targets = targets or TARGETS
    read = lambda path: [json.loads(x) for x in path.read_text().splitlines() if x.strip()]  # noqa: E731
    rows = {label: read(run_dir / f"eval_{label}.jsonl")
            for label in ("base", "warm_start", "trained") if (run_dir / f"eval_{label}.jsonl").exists()}
    periodic = {int(p.stem.rsplit("step", 1)[1]): read(p) for p in run_dir.glob("eval_test_step*.jsonl")}
    steps = [h for h in history if "reward_mean" in h]
    warm = next((h for h in history if h.get("phase") == "warm_start"), {})
    proof = {"timings": timings, "steps": len(steps),
             "train_seconds": sum(h.get("seconds", 0) for h in steps),
             "rollout_seconds": sum(h.get("rollout_seconds", 0) for h in steps),
             "warm_start": {k: v for k, v in warm.items() if k not in ("step", "phase")},
             "curve": held_out_curve(rows, periodic, len(steps)),
             "comparisons": {k: compare(rows["trained"], rows[k], gap) for k, gap in targets.items() if k in rows}}
    lines = ["| final vs | n | final | other | gap | s.e. unpaired | s.e. paired | wins/losses | target | met |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k, c in proof["comparisons"].items():
        met = c["meets_gap"] and c["meets_2se_unpaired"]
        lines.append(f"| {k} | {c['n']} | {c['final']:.1%} | {c['other']:.1%} | {c['gap'] * 100:+.1f} pts | "
                     f"{c['se_unpaired'] * 100:.1f} | {c['se_paired'] * 100:.1f} | {c['wins']}/{c['losses']} | "
                     f">= {c['target_gap'] * 100:.0f} pts, > 2 s.e. | "
                     f"{'yes' if met else ('paired s.e. only' if c['meets_gap'] and c['meets_2se_paired'] else 'no')} |")
    lines += ["", f"GRPO steps: {proof['steps']}, training time {proof['train_seconds']:.0f} s "
              f"(rollouts + updates); evaluations: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.get("eval_s", {}).items())]
    decode = [h["decode"] for h in steps if h.get("decode")]
    if decode:  # where the rollouts' sampling time went (LocalPolicy.decode_stats, per step)
        tot = {k: sum(d[k] for d in decode) for k in decode[0]}
        lines += ["", f"Sampling over the GRPO steps: prefill {tot['prefill_s']:.0f} s, decode loop {tot['decode_s']:.0f} s "
                  f"({tot['decode_steps']:.0f} steps), {tot['rows']:.0f} rows; padding "
                  f"{1 - tot['prompt_tokens'] / max(tot['padded_prompt_tokens'], 1):.0%} of prefilled tokens; requests "
                  f"waited {tot['queue_wait_s'] / max(tot['rows'], 1):.2f} s each for a batch on average"]
    sized = [h for h in steps if "max_seq_tokens" in h]
    if sized:  # the update's peak memory follows these; padding past a sliding window's end is the NaN suspect
        top = max(sized, key=lambda h: h["max_padding"])
        lines += ["", f"Update sizes: longest sequence {max(h['max_seq_tokens'] for h in sized):.0f} tokens; widest "
                  f"micro-batch {top['max_padding']:.0f} tokens of padding (step {top['step']}); skipped updates "
                  f"(non-finite gradient) {max(h.get('skipped_steps', 0) for h in sized):.0f}"]
    peaks = [h for h in steps if "gpu_peak_gib_update" in h]
    if peaks:  # which phase sets the memory, so how many runs fit on one card
        top = max(peaks, key=lambda h: h["gpu_peak_gib_update"])
        lines += ["", f"GPU memory peaks over the GRPO steps: rollouts, evaluations and warm start "
                  f"{max(h['gpu_peak_gib_before_update'] for h in peaks):.1f} GiB; update "
                  f"{top['gpu_peak_gib_update']:.1f} GiB (step {top['step']})"]
    if warm.get("gate"):
        lines += ["", "Warm-start gate: " + "; ".join(
            f"after epoch {c['epochs']}: {c['tool_errors']:.2f} tool errors, {c['completed_rate']:.0%} completed"
            f" ({'passed' if c['passed'] else 'not met'})" for c in warm["gate"])]
    if len(proof["curve"]) > 2:
        lines += ["", f"Held-out curve, the same {proof['curve'][0]['n']} scenarios at every point: "
                  + ", ".join(f"step {c['step']} {c['success']:.1%}" for c in proof["curve"])]
    proof["table"] = "\n".join(lines)
    try:
        plot_curve(run_dir, proof["curve"], history)
    except ImportError:
        pass
    (run_dir / "proof.json").write_text(json.dumps(proof, indent=2, default=str))
    (run_dir / "proof.md").write_text(proof["table"] + "\n")
    return proof


RESULT_FILES = ("proof.json", "proof.md", "metrics.jsonl", "state.json", "config.json", "report.md", "summary.json",
                "timings-call*.json", "*.png")


def _gzip(src: Path, dest: Path) -> None:
    """`dest` (name + .gz), byte-identical for the same input (no name or time in the header)."""
    import gzip

    with open(dest.with_name(dest.name + ".gz"), "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                                            filename="") as gz:
        gz.write(src.read_bytes())


def copy_results(run_dir: Path, dest: Path) -> Path:
    """The run's results without checkpoints or the tool-call log: what bench/results/learning/<run>/ holds.

    The per-scenario rows (eval_*.jsonl, the held-out scenarios: full transcripts, ~0.4 MB a policy)
    go gzipped (~10x smaller): every committed byte also travels in each GPU call's 64 MiB
    (`zcat eval_trained.jsonl.gz` reads one)."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for pattern in RESULT_FILES:
        for f in run_dir.glob(pattern):
            shutil.copy2(f, dest / f.name)
    for f in run_dir.glob("eval_*.jsonl"):
        _gzip(f, dest / f.name)
    derived = run_dir.with_name(run_dir.name + ".scenarios.jsonl")
    if derived.exists():
        _gzip(derived, dest / "heldout.scenarios.jsonl")
    print(f"results: {dest}", flush=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "bench" / "learning_proof.yaml"))
    ap.add_argument("--out", default=None, help="run folder (default: the config's out)")
    ap.add_argument("--deadline-s", type=float, default=540.0, help="wall-clock budget of the whole script")
    ap.add_argument("--max-batch", type=int, default=None, help="LocalPolicy batch (default: rollout concurrency)")
    ap.add_argument("--batch-wait-s", type=float, default=0.3, help="LocalPolicy: wait this long to fill a batch")
    ap.add_argument("--batch-gap-s", type=float, default=None, help="LocalPolicy: close a batch once no request came "
                    "for this long (still at most --batch-wait-s); default: wait the full --batch-wait-s")
    ap.add_argument("--random-weights", metavar="TOKENIZER_DIR", default=None,
                    help="SmolLM2-shaped random weights with this tokenizer: tests the machinery, proves nothing")
    ap.add_argument("--random-shape", choices=("smollm2", "tiny"), default="smollm2", help="shape for --random-weights")
    ap.add_argument("--train-budget-s", type=float, default=900.0, help="cap on all GRPO steps' seconds")
    ap.add_argument("--pause", action="store_true", help="at the deadline, stop before the final eval (resumable)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="config overrides")
    ap.add_argument("--seed", type=int, default=None, help="train.seed; the default --out becomes "
                    "runs/learning/<config name>-seed<k>")
    ap.add_argument("--results", default=None, metavar="DIR", help="when the run ends, copy its results (no "
                    "checkpoints) to DIR/<run folder name>, e.g. bench/results/learning")
    ap.add_argument("--target-base", type=float, default=TARGETS["base"], help="gap over base to meet")
    ap.add_argument("--target-warm-start", type=float, default=TARGETS["warm_start"], help="gap over the warm start")
    args = ap.parse_args(argv)
    start = time.monotonic()
    cfg = load_config(args.config)
    out = args.out or (str(ROOT / "runs" / "learning" / f"{Path(args.config).stem}-seed{args.seed}")
                       if args.seed is not None else None)
    # --set comes last, so its out= (or train.seed=) wins over the ones --seed derives
    cfg = apply_overrides(cfg, [*([f"train.seed={args.seed}"] if args.seed is not None else []),
                                *([f"out={out}"] if out and not args.out else []), *args.set,
                                *([f"out={args.out}"] if args.out else [])])
    run_dir = Path(cfg.out)
    derived = run_dir.with_name(run_dir.name + ".scenarios.jsonl")
    counts = heldout_file(cfg.scenarios, derived)
    cfg = apply_overrides(cfg, [f"scenarios={derived}"])
    print(f"held-out file {derived}: {counts} (val relabelled test)", flush=True)
    if distributed.init() and args.pause:  # under torchrun: join the process group before the model loads
        ap.error("--pause works in one process only: under torchrun a run goes to its end (--deadline-s still stops "
                 "its steps in time for the final evaluation)")
    if cfg.train.loader == "unsloth":  # before transformers is imported: Unsloth patches it on import
        from mcp_rl.unsloth_loader import import_unsloth

        import_unsloth()
    import torch

    from mcp_rl import runs

    random.seed(cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    trainer = build_trainer(cfg, max_batch=args.max_batch or cfg.rollout.concurrency,
                            batch_wait_s=args.batch_wait_s, batch_gap_s=args.batch_gap_s, random_weights=args.random_weights,
                            shape=args.random_shape)
    timings: dict = {"load_s": time.monotonic() - start, "ranks": distributed.world()}
    metrics = run_dir / "metrics.jsonl"
    before = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] \
        if args.resume and metrics.exists() else []
    install_deadline(cfg, start, args.deadline_s, timings, pause=args.pause, train_budget_s=args.train_budget_s,
                     trained_s=sum(h.get("seconds", 0) for h in before if "reward_mean" in h))
    calls = sorted(run_dir.glob("timings-call*.json")) if args.resume else []
    try:
        result = asyncio.run(runs.run(cfg, resume=args.resume, trainer=trainer))
    except Paused as e:
        result = None
        print(e, flush=True)
    timings["total_s"] = time.monotonic() - start
    if not distributed.is_main():  # under torchrun rank 0 alone writes the run folder and the proof
        return 0
    if torch.cuda.is_available():  # the trainer resets the peak around each update (train.gpu_peaks)
        steps = ([json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.exists() else [])
        steps = steps[len(before):]  # this call's steps
        timings["peak_gpu_gib"] = max([torch.cuda.max_memory_allocated() / 2**30] + [
            h[k] for h in steps for k in ("gpu_peak_gib_before_update", "gpu_peak_gib_update") if k in h])
    timings["generate_calls"] = trainer.policy.generate_calls
    (run_dir / f"timings-call{len(calls) + 1}.json").write_text(json.dumps(timings, indent=2))
    if result is None:
        return 0
    if calls:  # one run over several calls: keep each call's timings, and every evaluation's
        parts = [json.loads(c.read_text()) for c in calls] + [timings]
        timings = {"calls": parts, "eval_s": {k: v for t in parts for k, v in t.get("eval_s", {}).items()}}
    history = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    proof = proof_tables(run_dir, timings, history, {"base": args.target_base, "warm_start": args.target_warm_start})
    if args.results:
        copy_results(run_dir, Path(args.results) / run_dir.name)
    for r in (result.get("base"), result.get("warm_start"), result.get("trained")):
        if r is not None:
            print(r.line())
    print(proof["table"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
