"""Check: 2 gloo processes train the same LoRA as 1 process on the union of their batches.

A tiny random Llama (built from a config, seed 0) with SmolLM2's tokenizer, wrapped by
PortableTrainer, takes `--steps` GRPO steps (each on fixed trajectory groups of 3, 2 and 2
rollouts: 7 sequences, so the ranks get 4 and 3) once in this process alone and once as
`--world` processes joined over gloo on 127.0.0.1, each backpropagating its share of the same
step (mcp_rl/scale/distributed.py). It prints, per loss kind, the largest difference in LoRA weights
(and AdamW moments) between the single run and rank 0, and between the ranks, and, last,
`equal: True` or `equal: False` (float32 tolerance: sums in another order, and micro-batches
padded differently). About 20 s on 2 CPU cores.

    .venv/bin/python bench/checks/check_ddp.py --out bench/results/ddp.txt
    .venv/bin/python bench/checks/check_ddp.py --die-rank 1      # a rank dies before its all-reduce
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

TOL = 1e-5  # absolute, on LoRA weights of order 1e-2 after lr 1e-2 steps
LOSSES = ("dr_grpo", "grpo")
PROMPT = [{"role": "system", "content": "You answer questions about the company database."},
          {"role": "user", "content": "How many employees are there?"}]
STEPS = [  # per step: groups of (reply, reward)
    [[("There are 42 employees.", 1.0), ("I cannot say.", 0.0), ("Maybe 40?", 0.2)],
     [("The answer is 7.", 1.0), ("Seven hundred, I think, or more.", 0.0)],
     [("Sales has 12 people in it.", 0.0), ("12", 1.0)]],
    [[("Let me check the tables first.", 0.6), ("42", 1.0), ("No idea at all, sorry.", 0.0)],
     [("Engineering, with a budget of 3.2 million.", 1.0), ("Engineering.", 0.3)],
     [("It is Alice Smith.", 1.0), ("Bob.", 0.0)]],
]


def build(tok_dir: str, loss: str):
    from mcp_rl.policies.local_policy import LocalPolicy
    from mcp_rl.policies.models import load_local_tokenizer, tiny_llama
    from mcp_rl.training.portable import PortableTrainer

    tok = load_local_tokenizer(tok_dir)
    # Seed 0: the same model (and so the same LoRA init) on every rank; check_same verifies it.
    policy = LocalPolicy(tiny_llama(tok, max_position_embeddings=512), tok, name="tiny")
    return PortableTrainer(policy, learning_rate=1e-2, loss=loss, micro_batch_size=2, max_seq_len=256,
                           precision="fp32")


def groups_for(trainer, step: int):
    """The step's groups, with the sampler's logprobs taken from the current model (on-policy)."""
    import art
    from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
    from openai.types.chat.chat_completion_message import ChatCompletionMessage
    from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

    tok, model = trainer.policy.tokenizer, trainer.model
    prompt = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=False)
    out = []
    for group in STEPS[step]:
        trajs = []
        for text, reward in group:
            ids = tok.encode(text, add_special_tokens=False)
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
            lps = logits.log_softmax(-1).gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1)
            content = [ChatCompletionTokenLogprob(token=f"token_id:{i}", logprob=float(lp), bytes=None, top_logprobs=[])
                       for i, lp in zip(ids, lps)]
            choice = Choice(index=0, finish_reason="stop", logprobs=ChoiceLogprobs(content=content),
                            message=ChatCompletionMessage(role="assistant", content=text))
            trajs.append(art.Trajectory(messages_and_choices=[*PROMPT, choice], reward=reward))
        out.append(art.TrajectoryGroup(trajs))
    return out


def train(tok_dir: str, loss: str, steps: int, die: bool = False) -> dict:
    """Build, take `steps` steps on the whole batch (each rank its share), return the final state."""
    from mcp_rl.scale import distributed

    trainer = build(tok_dir, loss)
    distributed.check_same(trainer, "init")
    for step in range(steps):
        groups = groups_for(trainer, step)
        if die:
            os._exit(3)  # as a crashed rank: no clean shutdown, sockets closed by the OS
        metrics = trainer.train_step(groups)
        assert metrics["updated"] == 1.0 and metrics["num_sequences"] == 7.0, metrics
    distributed.check_same(trainer, f"step {steps}")
    moments = [v.clone() for s in trainer.optimizer.state.values() for k, v in sorted(s.items()) if k != "step"]
    return {"lora": {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n},
            "moments": moments, "loss": metrics["loss"], "step": trainer.step}


def worker(a: argparse.Namespace) -> int:
    from mcp_rl.scale import distributed

    distributed.init("gloo")
    for loss in a.losses:
        try:
            state = train(a.tokenizer, loss, a.steps, die=distributed.rank() == a.die_rank)
        except distributed.RankFailed as e:
            print(f"rank {distributed.rank()}: {e}", file=sys.stderr, flush=True)
            return 4
        torch.save(state, Path(a.worker_out) / f"rank{distributed.rank()}-{loss}.pt")
    return 0


def run_ranks(tok_dir: str, losses: list[str], steps: int, world: int, folder: Path, die_rank: int = -1,
              timeout: float = 300) -> tuple[list[int], list[str]]:
    """`world` processes of this script joined over gloo; returns their exit codes and stderr tails."""
    from mcp_rl.mcp.launch import free_port

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
           "OMP_NUM_THREADS": "1", "MCP_RL_DIST_TIMEOUT_S": "120"}
    procs = [subprocess.Popen([sys.executable, __file__, "--worker-out", str(folder), "--tokenizer", tok_dir,
                               "--losses", *losses, "--steps", str(steps), "--die-rank", str(die_rank)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    errs = [p.communicate(timeout=timeout)[1] for p in procs]
    return [p.returncode for p in procs], [e[-2000:] for e in errs]


def max_diff(a: dict, b: dict) -> tuple[float, float]:
    w = max(float((a["lora"][n] - b["lora"][n]).abs().max()) for n in a["lora"])
    m = max(float((x - y).abs().max()) for x, y in zip(a["moments"], b["moments"]))
    return w, m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2, choices=[1, 2])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    p.add_argument("--tokenizer", help="a saved tokenizer folder (default: SmolLM2's, saved to a temporary folder)")
    p.add_argument("--die-rank", type=int, default=-1, help="this rank exits before its first update")
    p.add_argument("--out", help="also write the output here")
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker_out:
        return worker(a)
    torch.set_num_threads(1)  # the same kernels as the 1-thread ranks
    lines = [f"# bench/checks/check_ddp.py {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC | "
             f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs | torch {torch.__version__} | "
             f"gloo, world {a.world}, {a.steps} steps, 7 sequences a step (groups 3+2+2), tolerance {TOL:g}"]
    say = lambda s: (lines.append(s), print(s, flush=True))  # noqa: E731
    print(lines[0], flush=True)
    equal = True
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = a.tokenizer
        if tok_dir is None:
            from mcp_rl.policies.local_policy import load_local_tokenizer

            tok_dir = str(Path(tmp) / "tok")
            load_local_tokenizer().save_pretrained(tok_dir)
        t0 = time.monotonic()
        singles = {loss: train(tok_dir, loss, a.steps) for loss in a.losses}
        t1 = time.monotonic()
        codes, errs = run_ranks(tok_dir, a.losses, a.steps, a.world, Path(tmp), a.die_rank)
        t2 = time.monotonic()
        say(f"1 process: {t1 - t0:.1f} s | {a.world} processes: {t2 - t1:.1f} s (each imports torch, transformers "
            f"and ART, then joins the group) | losses {', '.join(a.losses)}")
        if a.die_rank >= 0:
            survivors = [r for r in range(a.world) if r != a.die_rank]
            last = errs[survivors[0]].strip().splitlines()
            say(f"rank {a.die_rank} died (exit {codes[a.die_rank]}); survivors' exit codes "
                f"{[codes[r] for r in survivors]}; rank {survivors[0]} said: {last[-1] if last else '(nothing)'}")
            equal = False
        elif any(codes):
            say(f"ranks exited with {codes}: " + " | ".join(e.strip()[-400:] for e in errs))
            equal = False
        for loss in a.losses if not (a.die_rank >= 0 or any(codes)) else ():
            single = singles[loss]
            ranks = [torch.load(Path(tmp) / f"rank{r}-{loss}.pt") for r in range(a.world)]
            w, m = max_diff(single, ranks[0])
            wr, mr = max(max_diff(ranks[0], r) for r in ranks[1:])
            norm = max(float(v.abs().max()) for v in single["lora"].values())
            ok = w <= TOL and wr == 0.0 and ranks[0]["step"] == single["step"] == a.steps
            equal &= ok
            say(f"{loss}: max |LoRA 1 process - rank 0| {w:.3g} (largest LoRA weight {norm:.3g}), AdamW moments "
                f"{m:.3g} | rank 0 vs other ranks: LoRA {wr:.3g}, moments {mr:.3g} | last loss {single['loss']:.6f} "
                f"vs {ranks[0]['loss']:.6f}")
    say(f"equal: {equal}")
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
