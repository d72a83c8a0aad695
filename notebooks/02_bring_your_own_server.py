# %% [markdown]
# # Bring your own MCP server
#
# The tutorial's pipeline, pointed at any MCP server: a stdio command (`uvx mcp-server-time@2026.10.19`,
# `npx -y @scope/server@1.2.3`, `python my_server.py`) or an HTTP URL (`https://host/mcp`). Pin the
# version of a server you start with uvx or npx, so a run you resume next week talks to the same
# tools. The example is the reference **time** server (`get_current_time`, `convert_time`). You bring:
#
# - the server (`SERVER`);
# - tasks with answers you can check: here, time conversions computed in the notebook;
# - a reward: the verified answers, the RULER judge (any LLM endpoint, a local one included), and
#   a reward function you write yourself in step 3;
# - optionally an LLM that writes more training tasks from the server's tools (any endpoint too).
#
# **Start** as in the tutorial: on Colab a T4 runtime, then *Runtime → Run all*; the set-up cell
# finds the mcp-rl code (a clone, an uploaded zip, your Drive, or the repository URL). No GPU:
# `PRESET = "cpu"`. CI runs this notebook on a CPU with the embedded SmolLM2-135M model against
# `python -m mcp_server_time`.
#
# **Time on a T4: about an hour with the settings below** (10 steps of 4 x 6 rollouts, 40 held-out
# tasks). Estimates, made as in the tutorial's introduction (our H200 numbers for the Qwen2.5-3B
# shape divided by 15): a time-server episode is short (one or two tool calls, ~300 sampled tokens),
# so a step samples about 7k tokens (~2 min) and trains about 30k (~1 min).
#
# | phase (`t4`) | estimate on a T4 |
# |---|---|
# | install, then load the model (once per machine) | 10-18 min |
# | base evaluation, 40 tasks | ~4 min |
# | 10 GRPO steps | 25-40 min |
# | trained evaluation, export | ~4 + 3-5 min |
# | **total** | **about 45-70 min** |
#
# A server whose episodes are longer (more calls, longer results) takes longer in proportion to
# the tokens sampled. On Colab the run folder goes to your Google Drive (`DRIVE`), so a disconnect
# loses nothing: *Run all* again continues the run.

# %% tags=["parameters"]
# Parameters (papermill overrides these; CI: the embedded model against python -m mcp_server_time)
SERVER = "uvx mcp-server-time@2026.10.19"  # a stdio command, a .py file, or an http(s)://.../mcp URL (uvx: pip install uv)
SERVER_ENV = {}                        # environment variables for a stdio server (it inherits none of yours)
TOKEN_SECRET = None                    # name of a secret holding a bearer token (HTTP servers)
SERVER_TOOLS = None                    # the only tools the agent may use, a list of names; None: all
ALLOW_SIDE_EFFECTS = False             # offer tools not annotated read-only: only against a sandbox
PRESET = "t4"                          # t4: ART on a Colab T4, t4-unsloth: the light install, cpu: no GPU
MODEL = None                           # None: t4 -> Qwen/Qwen2.5-3B-Instruct (4-bit), cpu -> smollm2 (embedded)
TOOL_PREFIX = False                    # force a tool call at the start of each turn (tiny models)
STEPS = None                           # None: 10 on a T4 (about an hour, see the top), 2 on the CPU
GROUPS_PER_STEP = None                 # None: 4 (cpu: 2)
GROUP_SIZE = None                      # None: 6 (cpu: 4)
TRAIN_SCENARIOS = 60                   # time-conversion tasks to train on
EVAL_SCENARIOS = 40                    # held-out tasks, the same before and after (below 30: a smoke run)
MAX_TOKENS = 256
MAX_TURNS = 4
CUSTOM_WEIGHT = 0.5                    # weight of your reward function, 0 logs it only
JUDGE_MODEL = "openrouter/openai/gpt-4.1-mini"   # RULER judge (litellm name); None: no judge
JUDGE_BASE_URL = None                  # e.g. http://localhost:11434/v1 (Ollama); None: the provider's
JUDGE_KEY_SECRET = "OPENROUTER_API_KEY"          # secret holding the judge's key; None: no key needed
GENERATOR_MODEL = "openai/gpt-4.1-mini"          # task writer; None: hand-made tasks only
GENERATOR_BASE_URL = "https://openrouter.ai/api/v1"
GENERATOR_KEY_SECRET = "OPENROUTER_API_KEY"
LLM_SCENARIOS = 20
OUT = "runs/my-server"
FRESH_RUN = False
DRIVE = True                           # Colab: keep OUT on Google Drive (resume after a disconnect); ignored elsewhere
HF_REPO = None
SEED = 0

# %% tags=["install"]
# (the set-up cell: notebooks/first_cell.py, inlined by notebooks/sync.py)

# %% [markdown]
# ## Settings
#
# Every setting is in the parameters cell above (papermill replaces it in CI).
#
# **The judge and the task writer** each take a litellm model name, an OpenAI-compatible base URL
# and the name of the secret holding their key. No key? Point them at a local server: with
# [Ollama](https://ollama.com) running `qwen2.5:7b` on this machine, set
# `JUDGE_MODEL = "openai/qwen2.5:7b"`, `JUDGE_BASE_URL = "http://localhost:11434/v1"` and
# `JUDGE_KEY_SECRET = None` (the same for `GENERATOR_*`, whose model name has no `openai/`
# prefix); a vLLM server works the same way. Left as below, they use OpenRouter when an
# `OPENROUTER_API_KEY` exists and are off otherwise.
#
# **The server's environment.** A stdio server is a program on this machine: it gets a clean
# environment (PATH, HOME, locale and the like), not your exported API keys. Pass what it needs
# in `SERVER_ENV`.
#
# `TOOL_PREFIX = True` forces each turn to start with a tool call: an aid for tiny models that
# never emit one on their own (CI's CPU model).

# %%
# Keys come from Colab secrets (the key icon on the left) or the environment, else a hidden prompt
# (press Enter to skip). They are never printed, and never written into the notebook or the run folder.
from mcp_rl import get_secret

JUDGE_KEY = get_secret(JUDGE_KEY_SECRET, prompt=True) if JUDGE_KEY_SECRET else None
GENERATOR_KEY = (JUDGE_KEY if GENERATOR_KEY_SECRET == JUDGE_KEY_SECRET else  # one prompt for one key
                 get_secret(GENERATOR_KEY_SECRET, prompt=True) if GENERATOR_KEY_SECRET else None)
JUDGE_ON = bool(JUDGE_MODEL and (JUDGE_KEY or JUDGE_BASE_URL))
GENERATOR_ON = bool(GENERATOR_MODEL and LLM_SCENARIOS and (GENERATOR_KEY or not GENERATOR_KEY_SECRET))
print(f"judge: {JUDGE_MODEL if JUDGE_ON else 'off (no key or endpoint)'} | "
      f"task writer: {GENERATOR_MODEL if GENERATOR_ON else 'off'}")

# %%
# On Colab the run folder (and the paid LLM tasks beside it) go to Google Drive: a disconnect loses nothing.
import os

if DRIVE and any(k.startswith("COLAB_") for k in os.environ):  # the run folder on Drive survives a disconnect
    try:
        from google.colab import drive

        drive.mount("/content/drive")
        OUT = f"/content/drive/MyDrive/mcp-rl/{OUT.rstrip('/').split('/')[-1]}"
    except Exception as e:  # declined or unavailable: the run stays on this machine
        print(f"Drive not mounted ({type(e).__name__}): the run folder stays on this machine")
print("run folder:", OUT)

# %% [markdown]
# ## 1. Connect to the server and look at its tools
#
# What you train on is one `Environment` (mcp_rl/environment.py): the server, its tasks, their
# reward and, where you have them, demonstrations. This notebook builds one for your server in
# three cells: the server here, the tasks in step 2, your reward in step 3. The tutorial's company
# database is one too (mcp_rl/environments/company: server, question templates, SQL demonstrations).
#
# A stdio command is started once per rollout (each rollout holds one session); an HTTP URL is
# connected to. The table shows each tool's class, read from its MCP annotations: **read-only**
# (`readOnlyHint`, not `destructiveHint`) or **with side effects** (anything else, unannotated tools
# included). `collect_context` then reads the tools the agent will be offered and the resources; for
# a server that runs SQL it also reads the schema, as in the tutorial.

# %%
from mcp_rl import ToolPolicy, ToolSession, collect_context, tools_table

if SERVER.startswith("http"):
    spec = {"url": SERVER, **({"token": get_secret(TOKEN_SECRET, prompt=True)} if TOKEN_SECRET else {})}
else:
    spec = {"command": SERVER, "env": dict(SERVER_ENV)}
tool_policy = ToolPolicy(allow=SERVER_TOOLS, allow_side_effects=ALLOW_SIDE_EFFECTS)
print(await tools_table(spec, tool_policy))
async with ToolSession(spec, policy=tool_policy) as session:  # refuses here if side effects are not allowed
    ctx = await collect_context(session)
print(ctx.as_text()[:1200])

# %% [markdown]
# ### Tools with side effects
#
# An RL run calls the server's tools thousands of times with an exploring policy: a few hundred
# calls of a `write_query`, `send_email` or `create_ticket` tool can wreck data, mail people or
# file tickets. So a rollout refuses, by default, to offer the agent any tool with side effects,
# with one message naming them and the two ways on: an allowlist (`SERVER_TOOLS` above;
# `--tools` on the command line) or an explicit opt-in (`ALLOW_SIDE_EFFECTS`;
# `--allow-side-effects`). A filtered tool is never described to the model, and a call to it is
# answered as an unknown tool. **If the agent must use tools with side effects, train against a
# sandbox**: a copy of the database, a test account, a staging deployment; never production, since
# every exploratory call is real. Every call a run makes is in `OUT/tool_calls.jsonl`, counted per
# tool in the report. Below, a two-tool server made in the notebook shows the refusal and the
# allowlist.

# %%
from fastmcp import FastMCP

from mcp_rl import SideEffectsRefused

notes = FastMCP("notes")


@notes.tool(annotations={"readOnlyHint": True})
def read_notes() -> str:
    """All notes."""
    return "buy milk"


@notes.tool  # no annotations: it counts as having side effects
def delete_notes() -> str:
    """Delete every note."""
    return "deleted"


try:
    async with ToolSession(notes, policy=ToolPolicy()):
        pass
except SideEffectsRefused as e:
    print("refused:", e, "\n")
print(await tools_table(notes, ToolPolicy(allow=["read_notes"])))

# %% [markdown]
# ### A server with state: one per rollout, and a reward the environment owns
#
# A sandbox shared by parallel rollouts is not enough: rollouts of one group would see each other's
# writes. An `Environment` with an `episode` gives every rollout its own server or state (here a fresh
# in-process server; `stdio_episodes(command)` starts a stdio server per rollout with a private temp
# folder), torn down after the rollout. Arguments it `bind`s (a `state_key`) are set on every call and
# hidden from the model. Its `score` checks the outcome in that state before the teardown, and stands
# where a verified answer would: tasks need no answer. Tasks can carry their gold actions
# (`extra["actions"]`), which the environment replays as demonstrations. Below, the replayed gold
# actions score 1 and an agent that does nothing scores 0, four rollouts in parallel.

# %%
import contextlib

from mcp_rl import Environment, Episode, RolloutConfig, Scenario, ScriptedPolicy, gather_rollouts


@contextlib.asynccontextmanager
async def fresh_notes(task):  # a new server and state for each rollout
    state, server = [], FastMCP("notes")

    @server.tool
    def write_note(note: str) -> str:
        """Keep a note."""
        state.append(note)
        return "kept"

    yield Episode(server, state=state)


async def notes_kept(traj, task, episode):  # the environment's own check of the final state
    return float(episode.state == [task.extra["note"]])


stateful = Environment("notes", episode=fresh_notes, score=notes_kept)
tasks = [Scenario(id=f"n{i}", task=f"Keep the note 'call {i}'.", extra={
    "note": f"call {i}", "actions": [{"tool": "write_note", "arguments": {"note": f"call {i}"}}]}) for i in range(4)]
lazy = ScriptedPolicy(lambda messages: {"tool": "complete_task", "arguments": {"answer": "done"}})
writes = RolloutConfig(tool_policy=ToolPolicy(allow=["write_note"]), temperature=0.0)
for name, policy in (("gold actions", stateful.demonstrations(tasks)), ("does nothing", lazy)):
    groups = await gather_rollouts(policy, stateful, tasks, writes, desc=name)
    print(f"{name}: environment reward", [g.trajectories[0].metrics["env_reward"] for g in groups])

# %% [markdown]
# ## 2. Tasks
#
# Tasks you can check make the before/after comparison mean something. Time zones without
# daylight saving time give conversions whose answers never change, so the notebook computes
# them: `TRAIN_SCENARIOS` for training and `EVAL_SCENARIOS` held out (different clock times, so no
# test question is a training question). With a task writer on, `llm_scenarios` adds training tasks
# written from the server's tools (tasks naming tools the server lacks are rejected); they have no
# answer, so RULER and your reward score them.

# %%
import random
from pathlib import Path

from mcp_rl import Scenario, llm_scenarios, load_scenarios

OFFSETS = {"Etc/UTC": 0, "Asia/Tokyo": 540, "Asia/Kolkata": 330, "Asia/Shanghai": 480, "Asia/Dubai": 240,
           "Asia/Singapore": 480, "Africa/Nairobi": 180, "America/Bogota": -300, "Asia/Kathmandu": 345,
           "Pacific/Honolulu": -600, "Asia/Jakarta": 420, "America/Lima": -300, "Africa/Lagos": 60}


def conversion(rng, split, i) -> Scenario:
    src, dst = rng.sample(sorted(OFFSETS), 2)
    minute = rng.randrange(0, 24 * 60, 5) if split == "train" else rng.randrange(1, 24 * 60, 5)  # disjoint times
    out = (minute - OFFSETS[src] + OFFSETS[dst]) % (24 * 60)
    task = f"It is {minute // 60:02d}:{minute % 60:02d} in {src}. What time is it in {dst}? Answer as HH:MM."
    return Scenario(id=f"{split}-{i:03d}", task=task, answer=f"{out // 60:02d}:{out % 60:02d}", split=split)


rng = random.Random(SEED)
train = [conversion(rng, "train", i) for i in range(TRAIN_SCENARIOS)]
test = [conversion(rng, "test", i) for i in range(EVAL_SCENARIOS)]
llm_file = Path(f"{OUT.rstrip('/')}-llm-tasks.jsonl")  # beside the run folder: a re-run reuses, never re-buys
if GENERATOR_ON:
    try:
        await llm_scenarios(ctx, LLM_SCENARIOS, generator_model=GENERATOR_MODEL, seed=SEED, out_path=llm_file,
                            base_url=GENERATOR_BASE_URL, api_key=GENERATOR_KEY)
    except (RuntimeError, ValueError) as e:  # what was accepted is in the file
        print("LLM task writing stopped:", str(e)[:300])
train += load_scenarios(llm_file) if GENERATOR_ON and llm_file.exists() else []
print(f"{len(train)} training tasks ({sum(s.answer is None for s in train)} without an answer), {len(test)} held out"
      + ("  [a smoke run: under 30 held-out tasks, the comparison is noise]" if len(test) < 30 else ""))
for s in train[:2] + test[:2]:
    print(f"- {s.task}  ->  {s.answer!r}")

# %% [markdown]
# ## 3. Your reward function
#
# A reward function takes the finished trajectory and its scenario and returns a number.
# `traj.metadata["answer"]` is the final answer, `traj.messages()` the conversation (tool results
# have `role == "tool"`), `traj.metrics` the counts (`tool_calls`, `tool_errors`, `completed`...).
# It goes into the environment as `(name, fn, weight)`, named after the function, next to the
# built-in components: the reward is the weighted sum, a weight of 0 only logs it (`reward/<name>`
# in the metrics), and an exception in your function scores 0 with the error in `traj.logs`; it
# never stops training.
#
# For the time server: reward an answer that names a time (HH:MM) which a tool actually returned,
# so the model learns to read times from the tools instead of inventing them. This also scores
# LLM-written tasks that have no fixed answer.

# %%
import re

HHMM = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)\b")


def time_from_tool(traj, scenario) -> float:
    """1.0 when the final answer names a time (HH:MM) that appears in a tool result, else 0.0."""
    answer = str(traj.metadata.get("answer") or "")
    tool_text = " ".join(str(m.get("content") or "") for m in traj.messages() if m["role"] == "tool")
    times = [f"{int(h):02d}:{mm}" for h, mm in HHMM.findall(answer)]
    return float(any(t in tool_text for t in times))


from mcp_rl import Environment
env = Environment(SERVER, server=spec, rewards=[(time_from_tool.__name__, time_from_tool, CUSTOM_WEIGHT)])

# %%
from mcp_rl import open_run, preset

gpu_sizes = PRESET != "cpu"  # None above: an hour on a T4, the cpu preset's own sizes on a CPU
sizes = {"steps": STEPS or (10 if gpu_sizes else None), "groups_per_step": GROUPS_PER_STEP or (4 if gpu_sizes else None),
         "group_size": GROUP_SIZE or (6 if gpu_sizes else None)}
judge = {"judge_model": JUDGE_MODEL if JUDGE_ON else None, "judge_base_url": JUDGE_BASE_URL,
         "judge_api_key": JUDGE_KEY}
cfg = preset(PRESET, **({"model": MODEL} if MODEL else {}), tool_prefix=TOOL_PREFIX, out=OUT,
             server_tools=SERVER_TOOLS, allow_side_effects=ALLOW_SIDE_EFFECTS,
             rollout={"max_tokens": MAX_TOKENS, "max_turns": MAX_TURNS},
             reward=judge,
             train={**{k: v for k, v in sizes.items() if v is not None}, "warm_start_scenarios": 0, "seed": SEED,
                    "eval_every_split": "test"})  # this notebook's tasks have no val split: the curve uses test
run = open_run(cfg, env=env, fresh=FRESH_RUN)  # the run's config gets the environment's server and reward
cfg, run_dir = run.cfg, run.dir
print(f"{cfg.model} | {cfg.train.backend} trainer | tool_prefix {cfg.tool_prefix} | judge {cfg.reward.judge_model}")

# %% [markdown]
# ### Check the reward before trusting it
#
# The same audit as the tutorial's: policies that do no honest work (no lookups, constants, kitchen
# sinks, pasted results), played through the real loop and scored by this run's reward, your
# function included. On tasks with an answer, none may succeed on more than 2% of them, or the cell
# stops and names the cheat. Read its mean-reward column too: a cheat that earns much of what honest
# episodes earn is what RL will learn.

# %%
from mcp_rl import audit_before_training

audit = await audit_before_training(spec, train, cfg, run_dir, env)

# %% [markdown]
# ## 4. Load the model and read one rollout
#
# The tutorial's warm start replays its environment's demonstrations; this environment has none (an
# `Environment(plan=...)` gives them: fn(task) -> its tool calls). On a CPU, `TOOL_PREFIX = True`
# gives the tiny model its first tool calls instead.

# %%
from mcp_rl import rollout, score_trajectory, transcript

trainer = await run.trainer()
traj = await rollout(trainer.policy, spec, test[0], cfg.rollout)
score_trajectory(traj, test[0], cfg.reward)
print(transcript(traj))
print("your reward (time_from_tool):", traj.metrics["reward/time_from_tool"], "| expected:", test[0].answer)

# %% [markdown]
# ## 5. Evaluate, train, evaluate again
#
# Evaluation uses the held-out tasks; training uses all training tasks, rewarded by the verified
# answer where there is one, RULER when the judge is on, and your function. As in the tutorial,
# the run resumes where it stands when the cell runs again.

# %%
base = await run.evaluate("base", spec, test)
state = await run.train(spec, train, test=test)  # every eval_every steps: the first test tasks
trained = await run.evaluate("trained", spec, test)

# %%
from IPython.display import Image, Markdown, display

report = run.report(title=f"{cfg.model} on {SERVER}")
# The plots are shown below as images; their Markdown links only resolve next to the file.
display(Markdown("\n".join(l for l in report.read_text().splitlines() if not l.startswith("!["))))
for png in sorted(run_dir.glob("*.png")):
    display(Image(filename=str(png)))

# %% [markdown]
# ## 6. Export the agent
#
# The LoRA adapter of the last step, merged onto the base model in float16 and saved with its
# tokenizer to `OUT/merged` (from a shell: `python -m mcp_rl export --run OUT --merged OUT/merged`;
# add `--ollama OUT/ollama` for a GGUF and an Ollama Modelfile, as in the tutorial). Set `HF_REPO`
# to push it to the Hugging Face Hub (private; token from `HF_TOKEN`).

# %%
from mcp_rl import find_adapter, merge_adapter

merged = merge_adapter(find_adapter(run_dir), run_dir / "merged", base_model=cfg.model, device="cpu")
print("merged model:", merged)
if HF_REPO:
    from huggingface_hub import HfApi

    hub = HfApi(token=get_secret("HF_TOKEN", prompt=True))
    hub.create_repo(HF_REPO, private=True, exist_ok=True)
    hub.upload_folder(folder_path=str(merged), repo_id=HF_REPO)
    print(f"pushed {merged} to https://huggingface.co/{HF_REPO}")

# %% [markdown]
# ### The agent as an OpenAI-compatible endpoint
#
# As in the tutorial: with the portable trainer (`cpu`, `t4-unsloth`) `openai_app` serves the
# trained policy on a free port on 127.0.0.1 in a thread of its own; with ART (`t4`) vLLM already
# serves the trained LoRA, so the cell talks to vLLM's own URL. The `openai` client is made in this
# cell. It sends one held-out task with the server's tools and prints the reply. From a shell:
# `python -m mcp_rl serve --adapter OUT --port 8000`.

# %%
import json

from openai import AsyncOpenAI

from mcp_rl import ServerThread, openai_app, tools_json

endpoint = None
if cfg.train.backend == "art":  # vLLM's server, started by ART: the newest LoRA under the model's name
    base_url, api_key, served = (trainer.model.inference_base_url, trainer.model.inference_api_key,
                                 trainer.model.get_inference_name())
else:
    endpoint = ServerThread(openai_app(trainer.policy, name="my-agent")).start()
    base_url, api_key, served = endpoint.base_url, "not-needed", "my-agent"
client = AsyncOpenAI(base_url=base_url, api_key=api_key or "not-needed")  # made on this cell's loop
try:
    reply = await client.chat.completions.create(
        model=served, tools=json.loads(await tools_json(spec, tool_policy)), max_tokens=cfg.rollout.max_tokens,
        messages=[{"role": "system", "content": cfg.rollout.system_prompt}, {"role": "user", "content": test[0].task}])
    message = reply.choices[0].message
    print(f"served at {base_url} as {served!r}; first reply to {test[0].task!r}:")
    print("  text:", (message.content or "")[:300])
    print("  tool calls:", [(c.function.name, c.function.arguments) for c in message.tool_calls or []])
finally:
    await client.close()
    if endpoint is not None:
        endpoint.stop()

# %% [markdown]
# ## After a disconnect
#
# With `DRIVE = True` (the default on Colab) the run folder and the LLM-written tasks are on your
# Drive: reconnect, *Runtime → Run all*, and the run continues from its last recorded step (the
# base evaluation is loaded, not redone). Keep the settings it started with (`FRESH_RUN = False`).
