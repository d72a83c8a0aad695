"""Learning proof: does GRPO teach SmolLM2-135M-Instruct to use the company MCP server?

One run of `mcp_rl.run` (base eval -> warm start -> eval -> GRPO steps -> eval), with
the real embedded weights, the portable trainer, the company server over streamable HTTP
(`server: company`) and verifiable rewards only (no judge). The held-out set is the test split
plus the validation split relabelled `test` (79 + 49 = 128 scenarios), written to
`<out>.scenarios.jsonl` from `cfg.scenarios`: the pipeline evaluates its `test` split, and 79
alone is too few to separate a 5-point gap. Training still draws only from the train split.

    python bench/experiments/learning_proof.py --config bench/experiments/learning_proof.yaml --out runs/lp --deadline-s 540
    python bench/experiments/learning_proof.py ... --set train.learning_rate=5.0e-5    # any config override
    python bench/experiments/learning_proof.py ... --random-weights TOKENIZER_DIR        # dress rehearsal, no weights

A config plus callbacks: every setting the run uses is a Config field, recorded in config.json.
`--deadline-s`, `--train-budget-s` and `--pause` set `train.deadline_s`, `train.train_budget_s` and
`train.pause_at_deadline` (the library's `mcp_rl.runs.callbacks.Deadline`): GRPO steps continue while one
more step plus the final evaluation still fit (`train.steps` is then an upper bound), and their total
time over the whole run stays under the budget. A device call lasts at most 10 minutes, so one run
can span two: `--pause` stops after the last step that fits, before the final evaluation, and a second
call with `--resume` continues from the step checkpoint (LoRA weights and optimizer state):

    python bench/experiments/learning_proof.py --out /tmp/lp --deadline-s 560 --pause
    python bench/experiments/learning_proof.py --out /tmp/lp --deadline-s 560 --resume

The `Proof` callback times the run's parts (timings-call<n>.json, one per call) and, when the run
ends, writes proof.json and proof.md beside the pipeline's report.md / eval_*.jsonl / metrics.jsonl:
the gaps final-base and final-warm_start with their standard errors, both unpaired (two proportions)
and paired (per-scenario differences on the same scenarios), against the targets.

Issue 40's imitation baseline (bench/experiments/imitation_baseline.py): a GRPO run forks its committed warm
start to `<out>-imitation`; the same command with `--baseline imitation` (and `--out <out>-imitation`, the
default with `--seed`) continues that checkpoint with supervised epochs on every training demonstration for
`--train-budget-s` (or `--imitation-s`) seconds of updates, evaluates it as "imitation", and compares it with
base, warm start and, once the GRPO run has its final evaluation, RL-trained (paired s.e.):

    python bench/experiments/learning_proof.py --config C --seed K --deadline-s 560 --pause --baseline imitation
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

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, Path(__file__).resolve().parent):  # the package, and imitation_baseline beside this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from mcp_rl.scale import distributed  # noqa: E402  (runs is imported in main: it brings ART, and ART transformers)
from mcp_rl.runs.callbacks import STARTED, TrainerCallback  # noqa: E402  (STARTED: train.deadline_s counts from here)
from mcp_rl.runs.config import apply_overrides, load_config  # noqa: E402
from mcp_rl.tasks.scenarios import load_scenarios, save_scenarios  # noqa: E402

from imitation_baseline import ForkImitation, fork_dir, run_imitation, started_at_warm_start  # noqa: E402

# SmolLM2-135M's shape (from its GGUF), for the random-weights dress rehearsal only.
SMOLLM2_SHAPE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                     rms_norm_eps=1e-5, tie_word_embeddings=True)
TINY_SHAPE = dict(SMOLLM2_SHAPE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)  # CPU tests of this script
# Qwen2.5-3B-Instruct's shape (bench/speed/bench_step.py's T4-shaped step), with the given tokenizer's vocabulary:
# no Qwen tokenizer can be had here, so the embedding and head are 49k rows, not 152k (0.4 GiB less in float16).
QWEN3B_SHAPE = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=True)
SHAPES = {"smollm2": SMOLLM2_SHAPE, "tiny": TINY_SHAPE, "qwen3b": QWEN3B_SHAPE}
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


def random_model(tokenizer_dir: str, shape: str = "smollm2", dtype=None):
    """(model, tokenizer): SmolLM2-shaped random weights (`shape` "tiny" for CPU tests, "qwen3b" for the
    T4-shaped bench) for a rehearsal that tests the machinery and proves nothing; `parts.build_trainer(cfg,
    model=...)` builds the rest from cfg. `dtype`: the weights' on a GPU (default bfloat16)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mcp_rl.policies.local_policy import load_local_tokenizer

    tok = load_local_tokenizer(tokenizer_dir)
    tok.eos_token = "<|im_end|>"
    config = LlamaConfig(vocab_size=len(tok), bos_token_id=1, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.eos_token_id, **SHAPES[shape])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = (dtype or torch.bfloat16) if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: a 3B model's random init on the host takes minutes
        model = LlamaForCausalLM(config)
    return model.to(dtype=dtype).eval(), tok


class Proof(TrainerCallback):
    """Times this call's parts and, when the run ends, writes timings-call<n>.json (every call) and, once
    the run is finished, proof.json, proof.md and curve.png (through `run.write`: rank 0 writes)."""

    def __init__(self, targets: dict, **extra):
        self.targets, self.trainer = targets, None
        self.timings: dict = {"ranks": distributed.world(), **extra}
        self.steps: list[dict] = []

    def on_init_end(self, run, trainer) -> None:
        self.trainer = trainer
        self.timings["load_s"] = time.monotonic() - STARTED  # the model, and on a new run the reward audit

    def on_evaluate(self, run, label, result, seconds) -> None:
        self.timings.setdefault("eval_s", {})[label] = seconds

    async def on_step_end(self, run, record) -> None:
        self.timings.setdefault("step_s", []).append(record["seconds"])
        self.steps.append(record)

    def on_run_end(self, run, results) -> None:
        import torch

        timings = self.timings
        timings["total_s"] = time.monotonic() - STARTED
        if torch.cuda.is_available():  # the trainer resets the peak around each update (train.gpu_peaks)
            timings["peak_gpu_gib"] = max([torch.cuda.max_memory_allocated() / 2**30] + [
                h[k] for h in self.steps for k in ("gpu_peak_gib_before_update", "gpu_peak_gib_update") if k in h])
        if self.trainer is not None:
            timings["generate_calls"] = getattr(self.trainer.policy, "generate_calls", None)
        calls = sorted(run.dir.glob("timings-call*.json"))
        run.write(f"timings-call{len(calls) + 1}.json", timings)
        if "paused" in results:
            return
        if calls:  # one run over several calls: keep each call's timings, and every evaluation's
            parts = [json.loads(c.read_text()) for c in calls] + [timings]
            timings = {"calls": parts, "eval_s": {k: v for t in parts for k, v in t.get("eval_s", {}).items()}}
        proof = self.tables(run, timings)
        run.write("proof.json", {k: v for k, v in proof.items() if k != "png"})
        run.write("proof.md", proof["table"] + "\n")
        if proof.get("png"):
            run.write("curve.png", proof["png"])
        self.proof = proof

    def tables(self, run, timings: dict) -> dict:
        return proof_tables(run.dir, timings, run.state.history, self.targets)


class ImitationProof(Proof):
    """`Proof` for `--baseline imitation`: imitation vs base and warm start, and RL-trained vs imitation where
    the GRPO run's final evaluation is in one of `rl_dirs` (bench/experiments/imitation_baseline.py)."""

    def __init__(self, rl_dirs: list[Path], **extra):
        super().__init__({}, **extra)
        self.rl_dirs = rl_dirs

    def tables(self, run, timings: dict) -> dict:
        from imitation_baseline import imitation_tables

        return imitation_tables(run.dir, self.rl_dirs, timings, run.state.history, compare)


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


def plot_curve(run_dir: Path, curve: list[dict], history: list[dict]) -> bytes:
    """curve.png's bytes: held-out success and training-rollout success by step."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h for h in history if "reward_mean" in h]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([c["step"] for c in curve], [c["success"] for c in curve], marker="o", label="held-out (greedy)")
    ax.plot([h["step"] for h in steps], [h.get("grounded_rate", h["success_rate"]) for h in steps], alpha=0.5,
            label="training rollouts")
    ax.set_xlabel("GRPO step"), ax.set_ylabel("grounded success"), ax.legend(), ax.set_title(run_dir.name)
    png = io.BytesIO()
    fig.tight_layout(), fig.savefig(png, format="png", dpi=110), plt.close(fig)
    return png.getvalue()


def proof_tables(run_dir: Path, timings: dict, history: list[dict], targets: dict | None = None) -> dict:
    """proof.json's content from the run's evaluation rows and history: "table" is proof.md, "png" curve.png."""
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
        proof["png"] = plot_curve(run_dir, proof["curve"], history)
    except ImportError:
        pass
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
    ap.add_argument("--config", default=str(ROOT / "bench" / "experiments" / "learning_proof.yaml"))
    ap.add_argument("--out", default=None, help="run folder (default: the config's out)")
    ap.add_argument("--deadline-s", type=float, default=540.0, help="train.deadline_s: wall-clock budget of the "
                    "whole script (0: none)")
    ap.add_argument("--train-budget-s", type=float, default=900.0, help="train.train_budget_s: cap on all GRPO "
                    "steps' seconds (0: none)")
    ap.add_argument("--pause", action="store_true", help="train.pause_at_deadline: at the deadline, stop before "
                    "the final eval (resumable)")
    ap.add_argument("--random-weights", metavar="TOKENIZER_DIR", default=None,
                    help="SmolLM2-shaped random weights with this tokenizer: tests the machinery, proves nothing")
    ap.add_argument("--random-shape", choices=("smollm2", "tiny", "qwen3b"), default="smollm2", help="shape for --random-weights")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="config overrides")
    ap.add_argument("--seed", type=int, default=None, help="train.seed; the default --out becomes "
                    "runs/learning/<config name>-seed<k>")
    ap.add_argument("--results", default=None, metavar="DIR", help="when the run ends, copy its results (no "
                    "checkpoints) to DIR/<run folder name>, e.g. bench/results/learning")
    ap.add_argument("--target-base", type=float, default=TARGETS["base"], help="gap over base to meet")
    ap.add_argument("--target-warm-start", type=float, default=TARGETS["warm_start"], help="gap over the warm start")
    ap.add_argument("--baseline", choices=("grpo", "imitation"), default="grpo", help="imitation: issue 40's "
                    "baseline instead of GRPO steps, in <GRPO run>-imitation (bench/experiments/imitation_baseline.py)")
    ap.add_argument("--imitation-s", type=float, default=0.0, help="--baseline imitation: seconds of supervised "
                    "updates (0: train.train_budget_s, the GRPO phase's budget)")
    ap.add_argument("--rl-run", default=None, metavar="DIR", help="--baseline imitation: the GRPO run whose warm "
                    "start it continues (default: --out without its -imitation suffix)")
    args = ap.parse_args(argv)
    imitation = args.baseline == "imitation"
    cfg = load_config(args.config)
    suffix = "-imitation" if imitation else ""
    out = args.out or (str(ROOT / "runs" / "learning" / f"{Path(args.config).stem}-seed{args.seed}{suffix}")
                       if args.seed is not None else None)
    # --set comes after the flags' fields, so its own value of one wins; --out last of all
    cfg = apply_overrides(cfg, [*([f"train.seed={args.seed}"] if args.seed is not None else []),
                                *([f"out={out}"] if out and not args.out else []),
                                f"train.deadline_s={args.deadline_s}", f"train.train_budget_s={args.train_budget_s}",
                                f"train.pause_at_deadline={str(args.pause).lower()}", *args.set,
                                *([f"out={args.out}"] if args.out else [])])
    run_dir = Path(cfg.out)
    rl_dir = run_dir
    if imitation:
        if not args.rl_run and not run_dir.name.endswith(suffix):
            ap.error(f"--baseline imitation: --out {str(run_dir)[-60:]!r} does not end in -imitation: name the GRPO "
                     "run whose warm start it continues with --rl-run")
        rl_dir = Path(args.rl_run) if args.rl_run else run_dir.with_name(run_dir.name[: -len(suffix)])
        budget = args.imitation_s or cfg.train.train_budget_s
        if budget <= 0:
            ap.error("--baseline imitation needs a budget: --imitation-s SECONDS or --train-budget-s SECONDS")
        if why := started_at_warm_start(rl_dir, run_dir):
            ap.error(why)
    derived = rl_dir.with_name(rl_dir.name + ".scenarios.jsonl")  # the GRPO run's: config.json records the path
    counts = heldout_file(cfg.scenarios, derived)
    cfg = apply_overrides(cfg, [f"scenarios={derived}"])
    print(f"held-out file {derived}: {counts} (val relabelled test)", flush=True)
    if distributed.init() and cfg.train.pause_at_deadline:  # under torchrun: join the group before the model loads
        ap.error("--pause works in one process only: under torchrun a run goes to its end (--deadline-s still stops "
                 "its steps in time for the final evaluation)")
    if cfg.train.loader == "unsloth":  # before transformers is imported: Unsloth patches it on import
        from mcp_rl.policies.unsloth_loader import import_unsloth

        import_unsloth()
    import torch

    from mcp_rl.runs import parts
    from mcp_rl.runs import run as runs

    random.seed(cfg.train.seed)
    trainer = None  # the run builds it from cfg (seeded by train.seed)
    if args.random_weights:
        torch.manual_seed(cfg.train.seed)
        trainer = parts.build_trainer(cfg, model=random_model(args.random_weights, args.random_shape))
    rehearsal = {"random_weights": f"{args.random_shape} with {args.random_weights}"} if args.random_weights else {}
    if imitation:
        rl_dirs = [rl_dir, *([Path(args.results) / rl_dir.name] if args.results else [])]
        proof = ImitationProof(rl_dirs, **rehearsal)
        result = asyncio.run(run_imitation(cfg, budget_s=budget, pause=args.pause, trainer=trainer, callbacks=[proof],
                                           resume=args.resume or (run_dir / "forked_from.json").exists(),
                                           evals=proof.timings.setdefault("eval_s", {})))
    else:
        proof = Proof({"base": args.target_base, "warm_start": args.target_warm_start}, **rehearsal)
        result = asyncio.run(runs.run(cfg, resume=args.resume, trainer=trainer,
                                      callbacks=[proof, ForkImitation(fork_dir(run_dir))]))
    if "paused" in result:
        return 0
    if args.results and distributed.is_main():  # outside the run folder: rank 0 copies what it wrote
        copy_results(run_dir, Path(args.results) / run_dir.name)
    for r in (result.get("base"), result.get("warm_start"), result.get("imitation"), result.get("trained")):
        if r is not None:
            print(r.line())
    print(proof.proof["table"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
