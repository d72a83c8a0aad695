"""Benchmark: one PortableTrainer GRPO step on a Qwen2.5-3B-shaped model, bf16 vs 4 bits.

T4-like settings: a step of 8 sequences x ~2048 tokens (2 groups of 4 rollouts, rewards that
differ within each group), LoRA r=8 on all linear layers, gradient checkpointing, micro batch
1 or 2, bf16 autocast. The model is Qwen2.5-3B's shape (hidden 2048, intermediate 11008, 36
layers, 16 heads, 2 KV heads, vocab 151936, tied embeddings; 3.09 B parameters) with random
weights, saved once to --model-dir and loaded through `load_local_model` (bf16, or NF4 with
`quantize_4bit=True`, which needs bitsandbytes), exactly as the pipeline loads a Hugging Face
model. Each trajectory is a real `art.TrajectoryGroup` (a system + user prompt, one sampled
assistant Choice with token_id logprobs) tokenized by ART inside `train_step`. Reported per
setting: tokens/s over the timed steps (after one warm-up step) and peak GPU memory (allocated
and reserved) during them. Target: the 4-bit step's peak <= 15 GiB (a T4 has 15 GiB).

    python bench/speed/bench_trainer.py --tokenizer DIR --out bench/results/trainer.txt
    python bench/speed/bench_trainer.py --tokenizer DIR --shape tiny --modes bf16:2 --seq-len 256   # CPU check
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import art  # noqa: E402

from mcp_rl.policies.local_policy import LocalPolicy, art_tokenizer, load_local_model, load_local_tokenizer  # noqa: E402
from mcp_rl.policies.policy import choice_from_text  # noqa: E402
from mcp_rl.training.portable import PortableTrainer  # noqa: E402

# The Qwen2.5-3B shape is defined once, in the generation bench beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import QWEN3B, write_outputs  # noqa: E402

TINY = dict(QWEN3B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


def save_random_model(model_dir: Path, shape: dict, tokenizer_dir: str) -> None:
    """A random-weights Qwen2 model of `shape` + SmolLM2's tokenizer, as a from_pretrained folder."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (model_dir / "config.json").exists():
        return
    tok = load_local_tokenizer(tokenizer_dir)
    tok.eos_token = "<|im_end|>"
    config = Qwen2Config(**shape, bos_token_id=1, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    del model


def prompt_text(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(["table", "employee", "salary", "department", "query", "the", "of", "rows"])
                    for _ in range(n_words))


def trajectory(tok, words: str, n_assistant: int, reward: float, rng: random.Random) -> art.Trajectory:
    """System + user prompt (one per group, as in GRPO), then one assistant Choice of `n_assistant` token ids."""
    ids = [rng.randrange(200, len(tok) - 200) for _ in range(n_assistant)]
    text = tok.decode(ids)
    choice = choice_from_text(text, tokenizer=tok, token_ids=ids, logprobs=[-rng.uniform(0.1, 3.0) for _ in ids],
                              finish_reason="length")
    return art.Trajectory(messages_and_choices=[{"role": "system", "content": words},
                                                {"role": "user", "content": "How many employees are there?"}, choice],
                          reward=reward)


def groups_for(tok, seq_len: int, n_seqs: int, group_size: int = 4, seed: int = 0) -> tuple[list, int]:
    """n_seqs trajectories of ~seq_len tokens (a third prompt, the rest trained) in groups of 4."""
    from art.preprocessing.tokenize import tokenize_trajectory
    from art.trajectories import History

    rng = random.Random(seed)
    words = prompt_text(seq_len // 3, seed)
    probe = trajectory(tok, words, 16, 0.0, rng)
    res = tokenize_trajectory(art_tokenizer(tok), History(messages_and_choices=probe.messages_and_choices, tools=None), 1.0, False)
    n_assistant = seq_len - (len(res.token_ids) - 16)  # exact: assistant ids are taken from the Choice
    rewards = [1.0, 0.0, 0.5, 0.2]
    trajs = [trajectory(tok, words, n_assistant, rewards[i % group_size % len(rewards)], random.Random(seed + i))
             for i in range(n_seqs)]
    return [art.TrajectoryGroup(trajs[i:i + group_size]) for i in range(0, n_seqs, group_size)], len(res.token_ids) - 16 + n_assistant


def bench_mode(model_dir: Path, quant: bool, micros: list[int], args) -> list[dict]:
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model, tok = load_local_model(str(model_dir), quantize_4bit=quant)
    load_s = time.perf_counter() - t0
    policy = LocalPolicy(model, tok, name="qwen3b-shape")
    trainer = PortableTrainer(policy, learning_rate=1e-5, micro_batch_size=micros[0], max_seq_len=args.seq_len,
                              gradient_checkpointing=True, precision="bf16")
    static = torch.cuda.memory_allocated() / 2**30 if cuda else float("nan")
    groups, seq_len = groups_for(tok, args.seq_len, args.seqs)
    rows = []
    for mb in micros:
        trainer.micro_batch_size = mb
        trainer.train_step(groups)  # warm-up: kernels, allocator, optimizer state
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        tokens, seconds, loss = 0.0, 0.0, 0.0
        for _ in range(args.steps):
            m = trainer.train_step(groups)
            if cuda:
                torch.cuda.synchronize()
            tokens, seconds, loss = tokens + m["num_tokens"], seconds + m["seconds"], m["loss"]
            assert m["updated"] == 1.0 and m["num_sequences"] == args.seqs, m
        rows.append({"mode": "4-bit NF4" if quant else "bf16", "micro_batch": mb, "seqs": args.seqs, "seq_len": seq_len,
                     "steps": args.steps, "s_per_step": seconds / args.steps, "tok_s": tokens / seconds,
                     "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
                     "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else float("nan"),
                     "static_gib": static, "load_s": load_s, "loss": loss})
        print(table(rows[-1:]), flush=True)
    del trainer, policy, model
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'mode':<10} | {'micro':>5} | {'seqs x len':>10} | {'s/step':>6} | {'tok/s':>7} | {'peak alloc GiB':>14} | "
            f"{'peak reserved GiB':>17} | {'weights+LoRA GiB':>16}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['mode']:<10} | {r['micro_batch']:>5} | {r['seqs']:>4} x {r['seq_len']:<4} | {r['s_per_step']:>6.2f} | "
                     f"{r['tok_s']:>7.0f} | {r['peak_alloc_gib']:>14.2f} | {r['peak_reserved_gib']:>17.2f} | {r['static_gib']:>16.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, help="tokenizer folder (SmolLM2's) saved beside the random model")
    ap.add_argument("--model-dir", default="/tmp/qwen3b-shape", help="where the random model is saved (reused)")
    ap.add_argument("--shape", choices=["qwen3b", "tiny"], default="qwen3b")
    ap.add_argument("--modes", nargs="+", default=["bf16:2", "4bit:2,1"], help="MODE:MICRO[,MICRO...], MODE bf16 or 4bit")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per setting (after one warm-up)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch
    import transformers

    model_dir = Path(args.model_dir if args.shape == "qwen3b" else args.model_dir + "-tiny")
    save_random_model(model_dir, QWEN3B if args.shape == "qwen3b" else TINY, args.tokenizer)
    rows = []
    for spec in args.modes:
        mode, _, micros = spec.partition(":")
        rows += bench_mode(model_dir, mode == "4bit", [int(x) for x in (micros or "1").split(",")], args)
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    extra = ""
    try:
        import bitsandbytes

        extra = f" | bitsandbytes {bitsandbytes.__version__}"
    except ImportError:
        pass
    report = "\n".join([
        f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"device: {dev} | torch {torch.__version__} | transformers {transformers.__version__}{extra} | python {platform.python_version()}",
        f"model: {args.shape}-shaped Qwen2, random weights | LoRA r=8 all-linear | gradient checkpointing | bf16 autocast "
        f"| dr_grpo | {args.steps} timed steps after 1 warm-up | tokens/s counts every token of every sequence",
        "", table(rows), "", "target: 4-bit peak allocated <= 15 GiB", ""])
    write_outputs(args.out, report, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
