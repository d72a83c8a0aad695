"""Continuous batching (mcp_rl/policies/joining.py, LocalPolicy(join=True)): a request that arrives while a batch
decodes joins it in a finished row's slot and gets the tokens and logprobs of decoding it alone; what cannot join
(another temperature, a prompt longer than the columns left of the batch's) waits for the next batch."""

import asyncio
import time

import pytest

from mcp_rl.policies import joining
from mcp_rl.policies.local_policy import LocalPolicy
from mcp_rl.policies.policy import PolicyError
from test_local_policy import CONVERSATIONS, forward_logprobs, ids_of, tiny, tiny_gemma, tok  # noqa: F401


@pytest.fixture(autouse=True)
def slow_steps(monkeypatch):
    """A decode step of 3 ms at least: the tiny model's steps take microseconds on a fast machine, and a test's
    late requests must arrive while the decode still runs."""
    step = joining.SlotDecoder.step

    def slow(self, tokens, column):
        time.sleep(0.003)
        return step(self, tokens, column)

    monkeypatch.setattr(joining.SlotDecoder, "step", slow)


async def while_decoding(policy):
    """Wait until the policy's decode has admitted its first rows (the decode thread has started)."""
    for _ in range(2000):
        if policy.decode_stats["rows"]:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the decode never started")


async def long_then_late(policy, late, *, max_tokens=6, temperature=0.0):
    """One long request, then `late` conversations once its decode runs; their Choices."""
    first = asyncio.ensure_future(policy.complete(CONVERSATIONS[1], [], max_tokens=150, temperature=0))
    await while_decoding(policy)
    joined = await asyncio.gather(*[policy.complete(m, [], max_tokens=max_tokens, temperature=temperature)
                                    for m in late])
    await first
    return joined


@pytest.mark.parametrize("model_name, tool_prefix", [("tiny", False), ("tiny", True), ("tiny_gemma", False)])
async def test_requests_that_join_a_running_decode_get_the_forward_pass_logprobs(tok, model_name, tool_prefix,  # noqa: F811
                                                                                 request):
    model = request.getfixturevalue(model_name)
    policy = LocalPolicy(model, tok, join=True, max_batch=4, tool_prefix=tool_prefix)
    late = [CONVERSATIONS[0], CONVERSATIONS[2], CONVERSATIONS[0]]
    joined = await long_then_late(policy, late, max_tokens=12)
    assert policy.generate_calls == 1 and policy.decode_stats["joined"] == 3  # all three joined the long decode
    assert policy.last_batch_size == 4
    for choice, messages in zip(joined, late):
        assert len(ids_of(choice)) == 12 + len(policy._prefix_ids) * tool_prefix  # past Gemma's window of 4: the sliding mask moved with the row
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx(
            forward_logprobs(model, tok, messages, [], ids_of(choice)), abs=1e-4)
    alone = await LocalPolicy(model, tok, tool_prefix=tool_prefix).complete(late[1], [], max_tokens=12, temperature=0)
    assert ids_of(alone) == ids_of(joined[1])


async def test_a_slot_is_reused_and_more_requests_than_slots_queue_for_them(tok, tiny):  # noqa: F811
    policy = LocalPolicy(tiny, tok, join=True, max_batch=2)
    late = [CONVERSATIONS[k % 3] for k in range(5)]
    joined = await long_then_late(policy, late, max_tokens=4)
    assert policy.generate_calls == 1 and policy.decode_stats["joined"] == 5  # one free slot, taken five times
    plain = LocalPolicy(tiny, tok)
    for choice, messages in zip(joined, late):
        assert ids_of(choice) == ids_of(await plain.complete(messages, [], max_tokens=4, temperature=0))


async def test_more_late_requests_than_slots_end_the_joining_so_a_wider_batch_takes_them(tok, tiny):  # noqa: F811
    """A decode started by one request has 10 slots (2 x 1 + 8); when 40 arrive, the decode stops taking joiners,
    its rows finish, and the next batch takes the rest at once, instead of the 10 slots refilling for up to
    4 x max_tokens steps (160-200 decode steps before this rule, against 80 for two plain batches)."""
    policy = LocalPolicy(tiny, tok, join=True, max_batch=64, batch_wait_s=0.005)
    first = asyncio.ensure_future(policy.complete(CONVERSATIONS[0], [], max_tokens=40, temperature=0))
    await while_decoding(policy)
    late = await asyncio.gather(*[policy.complete(CONVERSATIONS[0], [], max_tokens=40, temperature=0)
                                  for _ in range(40)])
    await first
    while len(policy.decode_spans) < policy.generate_calls:  # rows are answered before their decode's stats are kept
        await asyncio.sleep(0.005)
    assert all(len(ids_of(c)) == 40 for c in late) and policy.decode_stats["rows"] == 41
    assert policy.decode_stats["joined"] == 9  # the rule ran: the first decode's 9 free slots, then no more
    assert policy.generate_calls == 2 and policy.decode_stats["decode_steps"] <= 3 * 40


async def test_one_request_more_than_the_free_slots_waits_for_a_slot_not_for_the_decode_to_end(tok, tiny):  # noqa: F811
    """Ten late requests for the nine free slots of a decode started by one long request: the tenth takes the
    first slot that frees (joining goes on), rather than waiting for the long row to end."""
    policy = LocalPolicy(tiny, tok, join=True, max_batch=64, batch_wait_s=0.005)
    first = asyncio.ensure_future(policy.complete(CONVERSATIONS[1], [], max_tokens=150, temperature=0))
    await while_decoding(policy)
    await asyncio.gather(*[policy.complete(CONVERSATIONS[0], [], max_tokens=4, temperature=0) for _ in range(10)])
    assert not first.done() and policy.decode_stats["joined"] == 10 and policy.generate_calls == 1
    await first


async def test_another_temperature_waits_for_the_next_batch(tok, tiny):  # noqa: F811
    policy = LocalPolicy(tiny, tok, join=True, max_batch=4)
    (choice,) = await long_then_late(policy, CONVERSATIONS[:1], temperature=1.0)
    assert policy.generate_calls == 2 and policy.decode_stats["joined"] == 0 and len(ids_of(choice)) == 6


async def test_a_prompt_longer_than_the_room_left_of_the_batch_waits(tok, tiny):  # noqa: F811
    """A request joins with its prompt ending at the batch's current column; one longer than every column
    left of it (the first prompts plus the room kept for later turns) is decoded in the next batch."""
    policy = LocalPolicy(tiny, tok, join=True, max_batch=4)
    long_prompt = [{"role": "user", "content": "word " * 120}]  # ~125 tokens; the first prompt's ~10 + room 2 x 20
    first = asyncio.ensure_future(policy.complete(CONVERSATIONS[0], [], max_tokens=20, temperature=0))
    await while_decoding(policy)
    choice = await policy.complete(long_prompt, [], max_tokens=6, temperature=0)
    assert first.done()  # it waited for the first decode to end
    assert policy.generate_calls == 2 and policy.decode_stats["joined"] == 0
    assert ids_of(choice) == ids_of(await LocalPolicy(tiny, tok).complete(long_prompt, [], max_tokens=6, temperature=0))


async def test_a_caller_that_gives_up_frees_its_slot(tok, tiny):  # noqa: F811
    policy = LocalPolicy(tiny, tok, join=True, max_batch=2)
    first = asyncio.ensure_future(policy.complete(CONVERSATIONS[1], [], max_tokens=150, temperature=0))
    await while_decoding(policy)
    with pytest.raises(asyncio.TimeoutError):  # a long request given up on: its row is dropped at a sync
        await asyncio.wait_for(policy.complete(CONVERSATIONS[0], [], max_tokens=150, temperature=0), 0.001)
    await asyncio.sleep(0.05)
    choice = await policy.complete(CONVERSATIONS[2], [], max_tokens=4, temperature=0)
    await first
    assert len(ids_of(choice)) == 4 and policy.generate_calls == 1


def test_join_refuses_the_prefix_cache(tok, tiny):  # noqa: F811
    with pytest.raises(ValueError, match="policy_reuse_prefix"):
        LocalPolicy(tiny, tok, join=True, reuse_prefix=True)


async def test_a_decode_that_fails_fails_the_requests_it_took_too(tok, tiny, monkeypatch):  # noqa: F811
    """A request taken to join (an out-of-memory prefill, say) gets the error, not a wait without end."""
    admit, calls = joining.SlotDecoder.admit, []

    def second_fails(self, *args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory (as a test)")
        return admit(self, *args)

    monkeypatch.setattr(joining.SlotDecoder, "admit", second_fails)
    policy = LocalPolicy(tiny, tok, join=True, max_batch=4)
    first = asyncio.ensure_future(policy.complete(CONVERSATIONS[1], [], max_tokens=150, temperature=0))
    await while_decoding(policy)
    late = asyncio.ensure_future(policy.complete(CONVERSATIONS[0], [], max_tokens=4, temperature=0))
    for request in (first, late):
        with pytest.raises(PolicyError, match="out of memory"):
            await asyncio.wait_for(request, 10)
