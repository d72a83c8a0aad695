"""LocalPolicy's batched decode (`join=False`, the default): one left-padded batch, decoded until its last row ends.

A hand-written decode loop instead of `model.generate`: on a GPU a small model's decode step is all launch
overhead (~40-110 ms a step through generate, for 135M and 3B alike, bench/RESULTS.md), which only a CUDA graph
removes, and generate cannot replay one without torch.compile (minutes of compiling, per batch shape). The
step itself is decoder.Decoder's; joining.py is the continuous-batching loop (`join=True`).
"""

from __future__ import annotations

import time
from typing import Any

from mcp_rl.policies.decoder import Decoder


def resolve(future: Any, choice: Any) -> None:
    """Answer `future` on its event loop (via call_soon_threadsafe) unless its caller gave up (timeout, cancel)."""
    if not future.done():
        future.set_result(choice)


def sample(logits: Any, temperature: float, t: int, tokens: Any, lps: Any, done: Any, stops: Any, pad: int) -> Any:
    """Each row's next token (`pad` for rows already done) into tokens[:, t] and its log-prob at temperature 1
    (DESIGN.md) into lps[:, t]; rows that drew an end-of-turn token are marked done. Returns the tokens."""
    import torch

    lp = torch.log_softmax(logits.float(), -1)
    if temperature > 0:
        tok = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1)[:, 0]
    else:
        tok = lp.argmax(-1)
    tok = torch.where(done, pad, tok)
    tokens[:, t], lps[:, t] = tok, lp.gather(-1, tok[:, None])[:, 0]
    done |= torch.isin(tok, stops)
    return tok


def decode(policy: Any, reqs: list) -> list[Any]:
    """The Choices of `reqs` (one sampling setting) decoded as one batch; with `policy.hand_back` a row that
    ends early is answered at once."""
    import torch

    device = policy.model.device
    n, width = len(reqs), max(len(r.prompt_ids) for r in reqs)
    max_new, pad = max(r.max_new for r in reqs), policy.stop_ids[0]  # pad with end-of-turn: cut anyway
    n_forced, temperature = reqs[0].n_forced, reqs[0].temperature
    ids = torch.full((n, width), pad, dtype=torch.long)
    keep = torch.zeros((n, width), dtype=torch.bool)
    for i, r in enumerate(reqs):
        ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
        keep[i, width - len(r.prompt_ids):] = True
    ids, keep = ids.to(device), keep.to(device)
    start = time.monotonic()
    plan, version = None, None
    if policy.prefix_cache is not None:
        version = policy._weights_version()
        policy.prefix_cache.check(version)
        plan = policy.prefix_cache.plan([r.prompt_ids for r in reqs], n_forced)
    from mcp_rl.training.kernels import lora_sampling

    with torch.inference_mode(), lora_sampling(policy.model, on=policy.fused_lora):
        decoder = Decoder(policy.model, ids, keep, width + max_new,
                           cuda_graph=policy.cuda_graph and device.type == "cuda", compiled=policy.compile_decode)
        logits, forced_lp = decoder.prefill(n_forced, plan.window if plan else None, plan.copies if plan else ())
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # one sync a batch, so prefill and decode time apart
        prefilled = time.monotonic()
        tokens = torch.full((n, max_new), pad, dtype=torch.long, device=device)
        lps = torch.zeros((n, max_new), dtype=torch.float32, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        stops, checked = torch.tensor(policy.stop_ids, device=device), 0
        limits = torch.tensor([r.max_new for r in reqs], device=device)
        handed = torch.zeros(n, dtype=torch.bool, device=device)
        forced = forced_lp.tolist() if forced_lp is not None else [[] for _ in reqs]
        fed = 0  # sampled tokens whose keys and values are in the cache
        for t in range(max_new):
            tok = sample(logits, temperature, t, tokens, lps, done, stops, pad)
            if (t + 1) % 8 == 0 or t + 1 == max_new:  # host syncs every 8 steps, not every step
                checked = policy._stop_at_string(tokens, done, checked, t + 1)
                gone = [i for i, r in enumerate(reqs) if r.future.cancelled()]  # callers that gave up
                if gone:
                    done[gone] = True
                done |= limits <= t + 1  # a row past its own max_tokens is finished too
                finished = done & ~handed
                if policy.hand_back and t + 1 < max_new and bool(finished.any()):
                    handed |= finished
                    hand_back(policy, reqs, finished, tokens[:, : t + 1], lps[:, : t + 1], forced)
                if bool(done.all()):
                    break
            if t + 1 < max_new:
                logits = decoder.step(tok, width + t)
                fed += 1
        new, new_lp = tokens.tolist(), lps.tolist()
        decoded = time.monotonic()
        if plan is not None and policy._weights_version() != version:  # updated mid-decode: mixed states
            policy.prefix_cache.clear()
        elif plan is not None:  # each row's ids that went through the model, from its first column on
            policy.prefix_cache.keep(plan, [None if r.future.cancelled() else (
                r.prompt_ids + new[i][:min(policy._end(new[i], r.max_new), fed)], width - len(r.prompt_ids))
                for i, r in enumerate(reqs)], decoder.kept)
    stats = policy.decode_stats
    stats["rows"] += n
    stats["prompt_tokens"] += sum(len(r.prompt_ids) for r in reqs)
    stats["padded_prompt_tokens"] += n * width
    stats["prefill_tokens"] += n * (plan.window if plan else width)
    stats["reused_tokens"] += plan.reused if plan else 0
    stats["decode_steps"] += t + 1
    stats["prefill_s"] += prefilled - start
    stats["decode_s"] += decoded - prefilled
    stats["keep_s"] += time.monotonic() - decoded
    stats["queue_wait_s"] += sum(start - r.queued for r in reqs)
    policy.decode_spans.append((start, time.monotonic()))
    policy.generate_calls += 1
    policy.last_batch_size = n
    return [policy._choice(r, new[i], new_lp[i], forced[i]) for i, r in enumerate(reqs)]


def hand_back(policy: Any, reqs: list, rows: Any, tokens: Any, lps: Any, forced: list) -> None:
    """Answer the requests of `rows` (finished) now, while the batch decodes its longer rows.

    Their rollouts go on to their tool calls during the decode's tail instead of after it, and
    are back in the queue for the next batch when this one ends (the serve loop skips answered
    futures). Called from the decode thread: results go to the event loop thread-safely."""
    index = rows.nonzero()[:, 0].tolist()
    for i, toks, lp in zip(index, tokens[index].tolist(), lps[index].tolist()):
        choice = policy._choice(reqs[i], toks, lp, forced[i])
        policy._loop.call_soon_threadsafe(resolve, reqs[i].future, choice)
