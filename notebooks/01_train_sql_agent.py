# %% [markdown]
# # Train a SQL agent on an MCP server with RL
#
# This notebook teaches a small open model, **Qwen2.5-3B-Instruct in 4 bits** on a free Colab T4,
# to answer questions about a company database by calling the tools of an MCP server
# (`list_tables`, `describe_table`, `run_query`). Every step is one call into `mcp_rl`:
# start the server, read its tools and schema, get training tasks, roll the model out against
# the real server, score each group of rollouts (verified answers, plus the RULER judge when you
# have an OpenRouter key), train with GRPO, compare the model before and after on the same
# held-out questions, then ask the trained agent something new and export it.
#
# In Colab choose *Runtime → Change runtime type → T4 GPU*, then *Runtime → Run all*. The same
# notebook runs on a CPU with the embedded SmolLM2-135M model (`PRESET = "cpu"`, `MODEL = "smollm2"`):
# that is how CI executes it, with tiny settings.
#
# **Times** below are for the `t4` preset on a T4. They are estimates, not measurements: this
# notebook has run end to end on an H200 held to a T4's float16 and 15 GiB (with the 135M model,
# `bench/results/`), never on a real T4. The estimates take our H200 numbers for the Qwen2.5-3B
# shape (`bench/RESULTS.md`: about 800 sampled tokens/s at 16 concurrent rollouts, 8,400 trained
# tokens/s in 4 bits) and divide them by 15, the H200/T4 ratio of memory bandwidth (4.8 vs
# 0.32 TB/s) and, roughly, of float16 tensor throughput.
#
# **Which install.** The install cell's `INSTALL` picks one of two Colab stacks:
# - `"art"` (the default, `PRESET = "t4"`): OpenPipe ART with vLLM 0.9.2 samples, Unsloth trains.
#   The faster sampler, so pick it for long runs; it replaces Colab's torch with 2.7 and takes
#   several minutes to install on every new Colab machine.
# - `"unsloth"` (with `PRESET = "t4-unsloth"`): the light install. Unsloth inside our portable
#   trainer, on Colab's own torch: no vLLM, no torch reinstall, the same Dr. GRPO loss. On an H200
#   held to a T4's float16 and 15 GiB its update ran 1.4x faster than peft + bitsandbytes, but its
#   sampler gave about half the tokens/s of the portable trainer's own, and in two SmolLM2 learning
#   runs its GRPO steps took 1.5-2.1x as long, so 15 minutes trained less (`bench/RESULTS.md`). Pick
#   it for short runs, quick experiments, or when the ART stack does not install.

# %% tags=["install"]
# (the install cell: notebooks/install_cell.py, inlined by notebooks/sync.py)

# %% [markdown]
# ## Settings
#
# Every setting is in the next cell (papermill replaces it in CI). `PRESET = "t4"` trains with
# OpenPipe ART (vLLM samples, Unsloth trains a 4-bit LoRA); `"cpu"` uses the portable
# transformers + peft trainer. `OVERRIDES` sets any other config field (`"train.lora_r=16"`,
# `"rollout.temperature=0.7"`); the config cell prints the result and rejects bad values before
# any GPU work (for example a `max_seq_len` that ART's log-prob chunks do not divide).
#
# **Runs are resumable.** Everything a run produces lives in `OUT`: checkpoints, `state.json`,
# evaluations, the report. Running the cells again (or after a restart) continues the recorded
# run: the base evaluation is loaded rather than redone, training goes on from the recorded step.
# `FRESH_RUN = True` starts a new folder beside it instead. `DRIVE = True` keeps `OUT` on your
# Google Drive, so a Colab disconnect loses nothing (see the last section).

# %% tags=["parameters"]
# Parameters (papermill overrides these; CI: PRESET="cpu", MODEL="smollm2", tiny steps)
PRESET = "t4"                        # t4: ART + vLLM on a Colab T4, t4-unsloth: the light install, cpu: the portable trainer
MODEL = "Qwen/Qwen2.5-3B-Instruct"   # 4-bit on the T4, or smollm2: the embedded CPU model
STEPS = 20                           # GRPO steps
GROUPS_PER_STEP = 4                  # scenarios (tasks) per step
GROUP_SIZE = 6                       # rollouts per scenario, compared with each other
EVAL_SCENARIOS = 60                  # held-out scenarios, the same before and after
WARM_START = None                    # demonstrations for a warm start, None: as the preset says
MAX_TOKENS = None                    # new tokens per assistant turn, None: as the preset says
MAX_TURNS = None                     # assistant turns per episode, None: as the preset says
OVERRIDES = []                       # more config fields, as strings (see the text above)
JUDGE_MODEL = "openrouter/openai/gpt-4.1-mini"  # RULER judge (litellm name), only with a key
GENERATOR_MODEL = "openai/gpt-4.1-mini"         # scenario writer on OpenRouter, only with a key
LLM_SCENARIOS = 40                   # extra LLM-written training tasks when a key exists
OUT = "runs/sql-agent"               # run folder: checkpoints, metrics, report, plots
FRESH_RUN = False                    # True: start a new run folder instead of resuming OUT
DRIVE = False                        # True (Colab): keep OUT on Google Drive, to resume after a disconnect
HF_REPO = None                       # a Hub repository such as you/sql-agent to push the merged model to
SEED = 0

# %%
# Keys come from Colab secrets (the key icon on the left) or the environment, else a hidden prompt
# (press Enter to skip). They are never printed, and never written into the notebook or the run folder.
from mcp_rl import get_secret

KEY = get_secret("OPENROUTER_API_KEY", prompt=True, export=True)
if KEY:
    print(f"OPENROUTER_API_KEY found: LLM scenarios and the RULER judge ({JUDGE_MODEL}) are on")
else:
    print("No OPENROUTER_API_KEY: continuing without an LLM, with verifiable rewards only (judge off)")

# %%
from mcp_rl import apply_overrides, preset

if DRIVE:  # Colab: the run folder on Google Drive survives a disconnect
    from google.colab import drive

    drive.mount("/content/drive")
    OUT = f"/content/drive/MyDrive/mcp-rl/{OUT.rstrip('/').split('/')[-1]}"
rollout_settings = {k: v for k, v in {"max_tokens": MAX_TOKENS, "max_turns": MAX_TURNS}.items() if v is not None}
train_settings = {"steps": STEPS, "groups_per_step": GROUPS_PER_STEP, "group_size": GROUP_SIZE,
                  "eval_scenarios": EVAL_SCENARIOS, "seed": SEED}
if WARM_START is not None:
    train_settings["warm_start_scenarios"] = WARM_START
cfg = apply_overrides(preset(PRESET, model=MODEL, out=OUT, train=train_settings, rollout=rollout_settings,
                             reward={"judge_model": JUDGE_MODEL if KEY else None}), OVERRIDES)
if cfg.train.loader == "unsloth":  # Unsloth patches transformers when imported: before ART imports it
    from mcp_rl import import_unsloth

    import_unsloth()
from mcp_rl import open_run

run = open_run(cfg, fresh=FRESH_RUN)
cfg, run_dir = run.cfg, run.dir
print(f"{cfg.model} | {cfg.train.backend} trainer | {cfg.train.steps} steps of {cfg.train.groups_per_step} x "
      f"{cfg.train.group_size} rollouts | {cfg.rollout.max_turns} turns x {cfg.rollout.max_tokens} tokens | "
      f"judge {cfg.reward.judge_model}")

# %% [markdown]
# The system prompt tells the model that **the database works and the tools must be used**: a small
# model left alone tends to apologise that it "cannot access databases" and guess.
#
# ## 1. Start the MCP server and look at its tools
#
# `mcp_server.py` serves a read-only SQLite company database (departments, employees, projects).
# It runs as a separate process over streamable HTTP on 127.0.0.1, a real MCP transport, and stays
# up until the last cell (running this cell again keeps the running server). The agent sees
# exactly these JSON schemas, plus `complete_task(answer)`.

# %%
import atexit

from mcp_rl import HttpServer, company_server_command, tools_json

if "server" not in globals() or not server.alive:
    server = HttpServer(company_server_command()).start()
    atexit.register(server.stop)  # also stopped when the kernel exits
print("MCP server:", server.url)
print(await tools_json(server.spec))

# %% [markdown]
# ## 2. Enrich the tool schemas
#
# `run_query(sql)` says nothing about which tables exist, so a model (or a scenario writer) shown
# only that schema invents table names. `collect_context` reads the real schema, row counts and
# sample rows through the server's own tools; `enrich_tools` adds the schema to the SQL tool's
# description.

# %%
from mcp_rl import ToolSession, collect_context, enrich_tools

async with ToolSession(server.spec) as session:
    ctx = await collect_context(session)
print(ctx.as_text()[:1500], "\n...")
sql_tool = next(t for t in enrich_tools(ctx.tools, ctx) if t["function"]["name"] == ctx.sql_tool[0])
print("\nenriched description:", sql_tool["function"]["description"][:400])

# %% [markdown]
# ## 3. Scenarios
#
# The repository ships `data/scenarios.jsonl`: questions written from SQL templates over the live
# schema, each with an answer computed through the server, split into train / val / test. With a
# key, an LLM (through ART's `generate_scenarios`) writes extra training tasks from the enriched
# context into `OUT/llm_scenarios.jsonl`; tasks naming tables or columns that do not exist are
# rejected. Running the cell again tops that file up to `LLM_SCENARIOS` and uses all of it. LLM
# tasks have no verified answer, so the RULER judge scores them; evaluation always uses the
# verified test split. About a minute with a key; instant without.

# %%
from mcp_rl import llm_scenarios, load_scenarios, load_splits

train, val, test = load_splits(cfg)  # verified: train / val / test of data/scenarios.jsonl
llm_file = run_dir / "llm_scenarios.jsonl"
if KEY and LLM_SCENARIOS:
    try:
        await llm_scenarios(ctx, LLM_SCENARIOS, generator_model=GENERATOR_MODEL, out_path=llm_file, seed=SEED)
    except (RuntimeError, ValueError) as e:  # what was accepted is in the file; the committed set suffices
        print("LLM scenario generation stopped:", str(e)[:300])
generated = load_scenarios(llm_file) if llm_file.exists() else []
print(f"{len(train)} verified training, {len(generated)} LLM-written, {len(test)} held-out test scenarios")
for s in test[:3] + generated[:3]:
    print(f"- {s.task}  ->  {s.answer!r}")

# %% [markdown]
# ## 4. The model and its trainer
#
# `run.trainer()` loads the policy and its trainer, at the step the run has reached. With ART
# (`t4`) the model is registered with a LocalBackend, which starts vLLM and Unsloth on the GPU: on
# a T4 about 5-10 minutes the first time (downloading about 2 GB of 4-bit weights, then vLLM's
# start-up; an estimate, not measured). With the portable trainer (`cpu`) the model is a local
# transformers model with a LoRA adapter. Running the cell again reuses the model already loaded.

# %%
trainer = await run.trainer()
print(type(trainer).__name__, "| policy", trainer.policy.name, "| step", trainer.step)

# %% [markdown]
# ## 5. One rollout
#
# A rollout is one episode: the task, the model's turns, each tool call run on the server and its
# result, until the model calls `complete_task` or runs out of turns. Errors (bad SQL, a malformed
# call) come back to the model as messages it can learn from. Before training, a 3B model usually
# lists the tables, runs a query or two and answers; expect some wrong column names.

# %%
from mcp_rl import rollout, score_trajectory, transcript

traj = await rollout(trainer.policy, server.spec, test[0], cfg.rollout)
score_trajectory(traj, test[0], cfg.reward)
print(f"policy at step {trainer.step}\n")
print(transcript(traj))
print("expected:", test[0].answer)

# %% [markdown]
# ## 6. Evaluate the base model on held-out scenarios
#
# Greedy decoding on the test split; a scenario counts as solved when the verified answer gets full
# credit. The same scenarios are evaluated again after training. "base" is always the step-0
# model: once this run is past it, the cell shows the saved result. On a T4, 60 scenarios take
# roughly 15 minutes (about 50k sampled tokens at ~55 tokens/s; estimate, see the top).

# %%
base = await run.evaluate("base", server.spec, test)

# %% [markdown]
# ## 7. Warm start (when the preset asks for it)
#
# The 135M CPU model never emits a tool call on its own, so RL would find no reward. The `cpu`
# preset first fine-tunes it on demonstrations: scripted solutions of *training* scenarios, each
# played through the real server so tool outputs are real. The 3B model on the T4 needs none.
# It runs once per run.

# %%
if await run.warm_start(server.spec, train) and cfg.train.eval_warm_start:
    await run.evaluate("warm_start", server.spec, test)

# %% [markdown]
# ## 8. Train
#
# Each step: `GROUPS_PER_STEP` training scenarios, `GROUP_SIZE` rollouts of each (progress bars),
# rewards for every group (verified answer + small shaping terms, plus RULER with a key), groups
# whose rollouts all scored the same are skipped (no signal for GRPO), then one LoRA update and a
# checkpoint in `OUT/checkpoints`. Expect one line per step such as
# `step 3/20 | reward 0.412 | success 35% | trained 3 groups, skipped 1 | loss 0.0021 | 140 s`;
# reward and success are noisy from step to step and should drift up over tens of steps.
# On a T4 a step of 4 x 6 rollouts (about 15k sampled tokens, 70k trained) takes roughly 4-7
# minutes, so 20 steps 1.5-2.5 hours, plus a 16-scenario validation check every 5 steps (about 4
# minutes each; estimates, see the top). Interrupted? Run the cell again: it goes on from the last
# completed step.

# %%
state = await run.train(server.spec, train + generated, val, test)

# %% [markdown]
# ## 9. Evaluate the trained model and see what changed
#
# The same held-out scenarios as step 6. The report puts the numbers side by side and shows two
# held-out scenarios as the base and the trained model handled them.

# %%
from IPython.display import Image, Markdown, display

trained = await run.evaluate("trained", server.spec, test)
print(f"verified success: base {base.success_rate:.0%} -> trained {trained.success_rate:.0%} (n={trained.n})")
report = run.report(title=f"{cfg.model} on the company MCP server")
# The plots are shown below as images; their Markdown links only resolve next to the file.
display(Markdown("\n".join(l for l in report.read_text().splitlines() if not l.startswith("!["))))
for png in sorted(run_dir.glob("*.png")):
    display(Image(filename=str(png)))

# %% [markdown]
# ## 10. Ask the trained agent something new
#
# A question that is not in the scenario file. Change `QUESTION` and run the cell again.

# %%
import dataclasses

from mcp_rl import Scenario

QUESTION = "Which department has the most employees, and how many does it have?"
ask = await rollout(trainer.policy, server.spec, Scenario(id="ask", task=QUESTION),
                    dataclasses.replace(cfg.rollout, temperature=0.0))
print(transcript(ask))

# %% [markdown]
# ## 11. Export the agent
#
# The LoRA adapter of the last step is merged onto the base model in float16 (never onto the
# 4-bit weights the T4 trained on) and saved with its tokenizer and chat template to `OUT/merged`:
# a Hugging Face model to serve with vLLM or transformers. `write_gguf` turns it into a GGUF file
# (8-bit, written with llama.cpp's own `gguf` package) for llama.cpp, LM Studio or Ollama, and
# `write_modelfile` writes an Ollama Modelfile whose template renders the chat format training
# used. The same from a shell:
# `python -m mcp_rl export --run OUT --merged OUT/merged --ollama OUT/ollama`. For the 3B model on
# Colab the merge runs on the CPU (vLLM holds the GPU): a few minutes and about 7 GB of RAM, then
# about 3.3 GB of GGUF (estimates, not measured on Colab).

# %%
from mcp_rl import find_adapter, merge_adapter, write_gguf, write_modelfile

adapter = find_adapter(run_dir)
print("adapter of the last step:", adapter)
merged = merge_adapter(adapter, run_dir / "merged", base_model=cfg.model, device="cpu")
gguf = write_gguf(merged, run_dir / "ollama" / "agent.gguf", quant="q8_0")
modelfile = write_modelfile(run_dir / "ollama", gguf, name="sql-agent")
print(f"merged model: {merged}\nGGUF: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB)")
print(f"on a machine with Ollama:\n  ollama create sql-agent -f {modelfile}\n  ollama run sql-agent")

# %% [markdown]
# ### The agent as an OpenAI-compatible endpoint
#
# `openai_app` serves the trained policy at `/v1/chat/completions` (tools in, `tool_calls` out,
# parsed exactly as in training), so any OpenAI client, agent framework or MCP client can use it.
# Below it answers one request from the `openai` client on a free port on 127.0.0.1, then stops.
# From a shell: `python -m mcp_rl serve --adapter OUT --port 8000`, then for instance
# `python -m mcp_rl eval --server company --base-url http://127.0.0.1:8000/v1 --model NAME`.

# %%
import json

from openai import AsyncOpenAI

from mcp_rl import ServerThread, openai_app, tools_json

endpoint = ServerThread(openai_app(trainer.policy, name="sql-agent")).start()
try:
    client = AsyncOpenAI(base_url=endpoint.base_url, api_key="not-needed")
    reply = await client.chat.completions.create(
        model="sql-agent", tools=json.loads(await tools_json(server.spec)), max_tokens=cfg.rollout.max_tokens,
        messages=[{"role": "system", "content": cfg.rollout.system_prompt}, {"role": "user", "content": QUESTION}])
    message = reply.choices[0].message
    print(f"served at {endpoint.base_url}; first reply to {QUESTION!r}:")
    print("  text:", (message.content or "")[:300])
    print("  tool calls:", [(c.function.name, c.function.arguments) for c in message.tool_calls or []])
finally:
    endpoint.stop()

# %% [markdown]
# Set `HF_REPO` to push the merged model to the Hugging Face Hub (a private repository; the token
# comes from the `HF_TOKEN` secret). Off by default.

# %%
if HF_REPO:
    from huggingface_hub import HfApi

    hub = HfApi(token=get_secret("HF_TOKEN", prompt=True))
    hub.create_repo(HF_REPO, private=True, exist_ok=True)
    hub.upload_folder(folder_path=str(merged), repo_id=HF_REPO)
    print(f"pushed {merged} to https://huggingface.co/{HF_REPO}")
else:
    print("HF_REPO not set: nothing pushed")

# %% [markdown]
# ## After a disconnect
#
# Colab recycles idle machines. With `DRIVE = True` the run folder is on your Drive: reconnect,
# choose *Runtime → Run all*, and the install cell re-installs on the new machine (several
# minutes), the run cell prints `resuming the recorded run at step N`, the base evaluation is
# loaded, and training continues from step N. Without Drive the folder is gone with the machine.
# The cell below shows where this run stands.

# %%
print(f"{run_dir}: step {run.step} of {cfg.train.steps}, phase {run.state['phase']}, "
      f"evaluated {sorted(run.state['evals'])}")
server.stop()  # the company server: run its cell (section 1) again before re-running the cells above
