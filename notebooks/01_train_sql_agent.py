# %% [markdown]
# # Train a SQL agent on an MCP server with RL
#
# This notebook teaches a small open model, **Qwen2.5-3B-Instruct in 4 bits** on a free Colab T4,
# to answer questions about a company database by calling the tools of an MCP server
# (`list_tables`, `describe_table`, `run_query`). Every step is one call into `mcp_rl`:
# start the server, read its tools and schema, get training tasks, roll the model out against
# the real server, score each group of rollouts (verified answers, plus an LLM judge when you
# give it one), train with GRPO, compare the model before and after on the same held-out
# questions, then ask the trained agent something new, export it and serve it.
#
# **Start.** In Colab choose *Runtime → Change runtime type → T4 GPU*, then *Runtime → Run all*.
# The set-up cell finds the mcp-rl code wherever this notebook came from (a clone, a zip of the
# repository uploaded to `/content`, a copy on your Google Drive, or the repository URL) and says
# what to do when it finds none. No GPU? Set `PRESET = "cpu"` below: the same notebook runs on
# the CPU with the embedded SmolLM2-135M model and tiny settings (that is how CI executes it).
#
# **Time on a T4: about an hour with the settings below** (6 GRPO steps of 4 x 6 rollouts, 24
# held-out questions), plus 15 minutes per 60 more held-out questions and 4-7 minutes per
# step. These are estimates, not measurements: the notebook has run end to end on an H100 held to a
# T4's float16 and 15 GiB (with the 135M model standing in for Qwen2.5-3B, which we cannot fetch;
# `bench/results/notebook_gpu/`: 20 steps, grounded success on 77 held-out questions 0% base, 9.1%
# warm start, 15.6% trained), never on a real T4.
# They take our H200 numbers for the Qwen2.5-3B shape (`bench/HISTORY.md` sections 2-3: about 800
# sampled tokens/s at 16 concurrent rollouts, 8,400 trained tokens/s in 4 bits) and divide them by
# 15, the H200/T4 ratio of memory bandwidth (4.8 vs 0.32 TB/s) and, roughly, of float16 throughput.
#
# | phase (`t4`, ART + vLLM) | estimate on a T4 |
# |---|---|
# | install (vLLM 0.9.2 and torch 2.7, once per machine) | 5-8 min |
# | load the model (2 GB of 4-bit weights, vLLM start-up) | 5-10 min |
# | base evaluation, 24 questions (~20k tokens at ~55 tokens/s) | ~6 min |
# | 6 GRPO steps (each ~15k sampled tokens, ~70k trained) | 24-42 min |
# | trained evaluation, then export (merge on the CPU, GGUF) | ~6 + 3-5 min |
# | **total** | **about 50-75 min** |
#
# The light install (`PRESET = "t4-unsloth"`) installs in about two minutes but samples about half
# as fast, so it runs 3 steps in the same hour. The CPU path (`PRESET = "cpu"`) runs the `cpu`
# preset, the same run as `make demo`: about 14 minutes on 2 quiet CPU cores, up to 39 on shared ones
# in our runs (Colab's free CPU machine has 2), plus the install. It shows that every stage runs; learning shows on a GPU
# (`bench/RESULTS.md`).
#
# **A disconnect loses nothing.** On Colab the run folder goes to your Google Drive (`DRIVE`), and
# every phase is recorded there: after a disconnect, *Run all* again continues the run (see the last
# section).
#
# **Which install.** `PRESET` picks the stack, and the set-up cell installs what it needs:
# - `"t4"` (the default): OpenPipe ART with vLLM 0.9.2 samples, Unsloth trains. The faster sampler,
#   so pick it for longer runs; it replaces Colab's torch with 2.7 and needs Colab's numpy below
#   2.3 (the set-up cell stops and says so otherwise).
# - `"t4-unsloth"`: the light install. Unsloth inside our portable trainer, on Colab's own torch
#   and numpy: no vLLM, no torch reinstall, the same Dr. GRPO loss. On an H200 held to a T4's
#   float16 and 15 GiB its update ran 1.4x faster than peft + bitsandbytes, but its sampler gave
#   about half the tokens/s, and in two SmolLM2 learning runs its GRPO steps took 1.5-2.1x as long
#   (`bench/RESULTS.md`). Pick it for short runs, or when the ART stack does not install.
# - `"cpu"`: the portable transformers + peft trainer on the CPU, with the embedded model.

# %% tags=["parameters"]
# Parameters (papermill overrides these; CI: PRESET="cpu", tiny steps). None: as PRESET says.
PRESET = "t4"                        # t4: ART + vLLM on a Colab T4, t4-unsloth: the light install, cpu: no GPU
MODEL = None                         # None: t4 -> Qwen/Qwen2.5-3B-Instruct (4-bit), cpu -> smollm2 (embedded)
STEPS = None                         # GRPO steps; None: about an hour on a T4 (6; 3 for t4-unsloth), cpu: 2
GROUPS_PER_STEP = None               # scenarios (tasks) per step; None: 4 (cpu: 2)
GROUP_SIZE = None                    # rollouts per scenario, compared with each other; None: 6 (cpu: 4)
EVAL_SCENARIOS = None                # held-out scenarios, the same before and after; None: 24 (cpu: 12)
WARM_START = None                    # demonstrations for a warm start, None: as the preset says
MAX_TOKENS = None                    # new tokens per assistant turn, None: as the preset says
MAX_TURNS = None                     # assistant turns per episode, None: as the preset says
OVERRIDES = []                       # more config fields, as strings (see the text below)
JUDGE_MODEL = "openrouter/openai/gpt-4.1-mini"   # RULER judge (litellm name); None: no judge
JUDGE_BASE_URL = None                # e.g. http://localhost:11434/v1 (Ollama); None: the provider's
JUDGE_KEY_SECRET = "OPENROUTER_API_KEY"          # secret holding the judge's key; None: no key needed
GENERATOR_MODEL = "openai/gpt-4.1-mini"          # task writer; None: the verified tasks only
GENERATOR_BASE_URL = "https://openrouter.ai/api/v1"
GENERATOR_KEY_SECRET = "OPENROUTER_API_KEY"
LLM_SCENARIOS = 40                   # extra LLM-written training tasks when the task writer is on
OUT = "runs/sql-agent"               # run folder: checkpoints, metrics, report, plots
FRESH_RUN = False                    # True: start a new run folder instead of resuming OUT
DRIVE = True                         # Colab: keep OUT on Google Drive (resume after a disconnect); ignored elsewhere
HF_REPO = None                       # a Hub repository such as you/sql-agent to push the merged model to
SEED = 0

# %% tags=["install"]
# (the set-up cell: notebooks/first_cell.py, inlined by notebooks/sync.py)

# %% [markdown]
# ## Settings
#
# Every setting is in the parameters cell above (papermill replaces it in CI). `OVERRIDES` sets
# any other config field (`"train.lora_r=16"`, `"rollout.temperature=0.7"`); the config cell below
# prints the result and rejects bad values before any GPU work (for example a `max_seq_len` that
# ART's log-prob chunks do not divide).
#
# **The judge and the task writer** each take a litellm model name, an OpenAI-compatible base URL
# and the name of the secret holding their key. Left as they are, they use OpenRouter when an
# `OPENROUTER_API_KEY` exists and are off otherwise: training then uses the verified answers only,
# which is enough for this server. No key but an LLM server of your own? Point them at it: with
# [Ollama](https://ollama.com) serving `qwen2.5:7b` where this notebook runs, set
# `JUDGE_MODEL = "openai/qwen2.5:7b"`, `JUDGE_BASE_URL = "http://localhost:11434/v1"`,
# `JUDGE_KEY_SECRET = None`, and the same for `GENERATOR_*` (whose model name has no `openai/`
# prefix); a vLLM server works the same way.
#
# **Runs are resumable.** Everything a run produces lives in `OUT`: checkpoints, `state.json`,
# evaluations, the report. Running the cells again (or after a restart) continues the recorded
# run: the base evaluation is loaded rather than redone, training goes on from the recorded step.
# `FRESH_RUN = True` starts a new folder beside it instead.

# %%
# Keys come from Colab secrets (the key icon on the left) or the environment, else a hidden prompt
# (press Enter to skip). They are never printed, and never written into the notebook or the run folder.
from mcp_rl import get_secret

JUDGE_KEY = get_secret(JUDGE_KEY_SECRET, prompt=True) if JUDGE_KEY_SECRET else None
GENERATOR_KEY = (JUDGE_KEY if GENERATOR_KEY_SECRET == JUDGE_KEY_SECRET else  # one prompt for one key
                 get_secret(GENERATOR_KEY_SECRET, prompt=True) if GENERATOR_KEY_SECRET else None)
JUDGE_ON = bool(JUDGE_MODEL and (JUDGE_KEY or JUDGE_BASE_URL))
GENERATOR_ON = bool(GENERATOR_MODEL and LLM_SCENARIOS and (GENERATOR_KEY or not GENERATOR_KEY_SECRET))
print(f"judge: {JUDGE_MODEL if JUDGE_ON else 'off (no key or endpoint): verified answers only'} | "
      f"task writer: {GENERATOR_MODEL if GENERATOR_ON else 'off: the verified tasks only'}")

# %%
import os

from mcp_rl import apply_overrides, open_run, preset

if DRIVE and any(k.startswith("COLAB_") for k in os.environ):  # the run folder on Drive survives a disconnect
    try:
        from google.colab import drive

        drive.mount("/content/drive")
        OUT = f"/content/drive/MyDrive/mcp-rl/{OUT.rstrip('/').split('/')[-1]}"
    except Exception as e:  # declined or unavailable: the run stays on this machine
        print(f"Drive not mounted ({type(e).__name__}): the run folder stays on this machine")
HOUR = {"t4": (6, 4, 6, 24), "t4-unsloth": (3, 4, 6, 24)}  # about an hour on a T4 (see the top)
steps, groups, size, n_eval = HOUR.get(PRESET, (None,) * 4)
train_settings = {k: v for k, v in {
    "steps": STEPS or steps, "groups_per_step": GROUPS_PER_STEP or groups, "group_size": GROUP_SIZE or size,
    "eval_scenarios": EVAL_SCENARIOS or n_eval, "warm_start_scenarios": WARM_START, "seed": SEED,
    "eval_every": 0 if PRESET in HOUR else None}.items() if v is not None}  # an hour has no room for val checks
rollout_settings = {k: v for k, v in {"max_tokens": MAX_TOKENS, "max_turns": MAX_TURNS}.items() if v is not None}
judge = {"judge_model": JUDGE_MODEL if JUDGE_ON else None, "judge_base_url": JUDGE_BASE_URL, "judge_api_key": JUDGE_KEY}
cfg = apply_overrides(preset(PRESET, server="company", out=OUT, train=train_settings, rollout=rollout_settings,
                             reward=judge, **({"model": MODEL} if MODEL else {})), OVERRIDES)
if cfg.train.loader == "unsloth":  # Unsloth patches transformers when imported: before ART imports it
    from mcp_rl import import_unsloth

    import_unsloth()
run = open_run(cfg, fresh=FRESH_RUN)
cfg, run_dir = run.cfg, run.dir
print(f"{cfg.model} | {cfg.train.backend} trainer | {cfg.train.steps} steps of {cfg.train.groups_per_step} x "
      f"{cfg.train.group_size} rollouts | {cfg.rollout.max_turns} turns x {cfg.rollout.max_tokens} tokens | "
      f"{cfg.train.eval_scenarios} held-out | judge {cfg.reward.judge_model} | run folder {run_dir}")

# %% [markdown]
# ## 1. Start the MCP server and look at what the agent sees
#
# `mcp_server.py` serves a read-only SQLite company database (departments, employees, projects).
# It runs as a separate process over streamable HTTP on 127.0.0.1, a real MCP transport, and stays
# up until the last cell (running this cell again keeps the running server). Every rollout gives
# the agent exactly this: the system prompt printed below, the task, and these JSON tool schemas
# plus `complete_task(answer)`. The system prompt tells the model that **the database works and
# the tools must be used**: a small model left alone tends to apologise that it "cannot access
# databases" and guess.

# %%
import atexit

from mcp_rl import tools_json

if "server" not in globals() or not server.alive:
    server = run.env.start()  # the company environment's server (mcp_rl/environments/company)
    atexit.register(server.stop)  # also stopped when the kernel exits
print("MCP server:", server.url)
print("system prompt:", cfg.rollout.system_prompt, "\n")
print(await tools_json(server.spec))

# %% [markdown]
# ## 2. Enrich the tool schemas for the task writer
#
# `run_query(sql)` says nothing about which tables exist, so a scenario writer shown only that
# schema invents table names. `collect_context` reads the real schema, row counts and sample rows
# through the server's own tools; `enrich_tools` adds the schema to the SQL tool's description.
# This enriched context goes to the LLM task writer (section 3) and to its check that a task names
# only real tables. The agent itself is not shown it: rollouts offer the server's own schemas
# (section 1), so the agent learns to look tables up with `list_tables` and `describe_table`.

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
# schema, each with an answer computed through the server, split into train / val / test. With the
# task writer on, an LLM (through ART's `generate_scenarios`) writes extra training tasks from the enriched
# context into `OUT/llm_scenarios.jsonl`; tasks naming tables or columns that do not exist are
# rejected. Running the cell again tops that file up to `LLM_SCENARIOS` and uses all of it. LLM
# tasks have no verified answer, so the RULER judge scores them (with the judge off they earn only
# the shaping terms); evaluation always uses the verified test split. About a minute with the task
# writer on; instant without.

# %%
from mcp_rl import llm_scenarios, load_scenarios, load_splits

train, val, test = load_splits(cfg)  # verified: train / val / test of data/scenarios.jsonl
llm_file = run_dir / "llm_scenarios.jsonl"
if GENERATOR_ON:
    try:
        await llm_scenarios(ctx, LLM_SCENARIOS, generator_model=GENERATOR_MODEL, out_path=llm_file, seed=SEED,
                            base_url=GENERATOR_BASE_URL, api_key=GENERATOR_KEY)
    except (RuntimeError, ValueError) as e:  # what was accepted is in the file; the committed set suffices
        print("LLM scenario generation stopped:", str(e)[:300])
generated = load_scenarios(llm_file) if GENERATOR_ON and llm_file.exists() else []
print(f"{len(train)} verified training, {len(generated)} LLM-written, {len(test)} held-out test scenarios")
for s in test[:3] + generated[:3]:
    print(f"- {s.task}  ->  {s.answer!r}")

# %% [markdown]
# ### Check the reward before trusting it
#
# RL learns whatever the reward pays for, cheating included. The audit plays policies that do no
# honest work through the real rollout loop and this run's reward: an empty answer, the question
# echoed, the most common answer of each type, kitchen sinks of every name or number the server
# returned, a real lookup followed by a constant, another task's result pasted whole. A cheat may
# succeed on at most 2% of the training tasks (`cfg.reward.audit_max_success`), or the cell stops.
# The demonstrations beside them should succeed on every task. About 30 s on a CPU.

# %%
from mcp_rl import audit_before_training

audit = await audit_before_training(server.spec, train, cfg, run_dir)  # its table: OUT/reward_audit.md

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
# model: once this run is past it, the cell shows the saved result. On a T4, the 24 scenarios of the
# hour-long settings take roughly 6 minutes (about 20k sampled tokens at ~55 tokens/s; estimate, see
# the top). At n = 24 one standard error is up to 10 points: a first look, not a measurement (60
# scenarios add about 9 minutes to each evaluation).

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
# rewards for every group (verified answer + small shaping terms, plus RULER when the judge is on), groups
# whose rollouts all scored the same are skipped (no signal for GRPO), then one LoRA update and a
# checkpoint in `OUT/checkpoints`. Expect one line per step such as
# `step 3/6 | reward 0.412 | success 35% | trained 3 groups, skipped 1 | loss 0.0021 | 340 s`.
# That step success is over the step's *training* scenarios, sampled at temperature 1.0: it is noisy
# from step to step and is not the held-out number; the held-out success (greedy, the same test
# questions before and after) is section 9's. Both should drift up over tens of steps; 6 steps are a
# start, and more steps (`STEPS`) are what learning needs.
# On a T4 a step of 4 x 6 rollouts (about 15k sampled tokens, 70k trained) takes roughly 4-7
# minutes (estimates, see the top). Interrupted or disconnected? Run the cell again (after a
# disconnect: *Run all*): it goes on from the last completed step.

# %%
state = await run.train(server.spec, train + generated, val, test)

# %% [markdown]
# ## 9. Evaluate the trained model and see what changed
#
# The same held-out scenarios as step 6, greedy. *Verified success* counts a scenario as solved when
# the final answer matches the answer computed through the server; *grounded success*, what the
# reward pays, also needs a tool result of that episode to have shown the value (a right guess
# earns nothing). The transcripts the report picks for "before / after" are grounded wins. The report puts the numbers side by side and shows two
# held-out scenarios as the base and the trained model handled them.

# %%
from IPython.display import Image, Markdown, display

trained = await run.evaluate("trained", server.spec, test)
for r in (base, trained):
    print(f"{r.label:>8}: grounded success {r.grounded_rate:.0%} ± {r.grounded_se:.0%} | correct answers "
          f"{r.success_rate:.0%} (n={r.n})")
report = run.report(title=f"{cfg.model} on the company MCP server")
# The plots are shown below as images; their Markdown links only resolve next to the file.
display(Markdown("\n".join(l for l in report.read_text().splitlines() if not l.startswith("!["))))
for png in sorted(run_dir.glob("*.png")):
    display(Image(filename=str(png)))

# %% [markdown]
# ## 10. Ask the trained agent something new
#
# A question that is not in the scenario file. Change `QUESTION` and run the cell again. It has
# no verified answer, so read the transcript: an answer is only as good as the tool results above
# it. The cell also says which values of the answer a successful tool result showed (`supported`).

# %%
import dataclasses

from mcp_rl import Scenario, supported

QUESTION = "Which department has the most employees, and how many does it have?"
ask = await rollout(trainer.policy, server.spec, Scenario(id="ask", task=QUESTION),
                    dataclasses.replace(cfg.rollout, temperature=0.0))
print(transcript(ask))
print("shown by a tool result:", supported(ask, QUESTION) or "(no answer)")

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
# The trained agent answers any OpenAI client, agent framework or MCP client at
# `/v1/chat/completions` (tools in, `tool_calls` out). With the portable trainer (`cpu`,
# `t4-unsloth`), `openai_app` serves the policy on a free port on 127.0.0.1, in a thread of its
# own. With ART (`t4`), vLLM already serves the trained LoRA as an OpenAI endpoint (Hermes tool
# parser, as in training), so the cell talks to vLLM's own URL. Either way the `openai` client is
# made here, in this cell. The cell asks one question, then stops what it started. From a shell,
# after export: `python -m mcp_rl serve --adapter OUT --port 8000`, then for instance
# `python -m mcp_rl eval --server company --base-url http://127.0.0.1:8000/v1 --model NAME`.

# %%
import json

from openai import AsyncOpenAI

from mcp_rl import ServerThread, openai_app, tools_json

endpoint = None
if cfg.train.backend == "art":  # vLLM's server, started by ART: the newest LoRA under the model's name
    base_url, api_key, served = (trainer.model.inference_base_url, trainer.model.inference_api_key,
                                 trainer.model.get_inference_name())
else:
    endpoint = ServerThread(openai_app(trainer.policy, name="sql-agent")).start()
    base_url, api_key, served = endpoint.base_url, "not-needed", "sql-agent"
client = AsyncOpenAI(base_url=base_url, api_key=api_key or "not-needed")  # made on this cell's loop
try:
    reply = await client.chat.completions.create(
        model=served, tools=json.loads(await tools_json(server.spec)), max_tokens=cfg.rollout.max_tokens,
        messages=[{"role": "system", "content": cfg.rollout.system_prompt}, {"role": "user", "content": QUESTION}])
    message = reply.choices[0].message
    print(f"served at {base_url} as {served!r}; first reply to {QUESTION!r}:")
    print("  text:", (message.content or "")[:300])
    print("  tool calls:", [(c.function.name, c.function.arguments) for c in message.tool_calls or []])
finally:
    await client.close()
    if endpoint is not None:
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
# ## After a disconnect: resume
#
# Colab recycles idle machines. On Colab the run folder is on your Drive (`DRIVE = True`, the
# default): reconnect, choose *Runtime → Run all*, and the set-up cell installs again on the new
# machine (several minutes for `t4`), the config cell prints `resuming the recorded run at step N`,
# the base evaluation is loaded, and training continues from step N. Keep the settings the run
# started with (`FRESH_RUN = False`). Without Drive the folder is gone with the machine. The cell
# below shows where this run and any other run beside it stand.

# %%
import json

for folder in sorted(run_dir.parent.iterdir()):
    if (folder / "state.json").is_file():
        s = json.loads((folder / "state.json").read_text())
        print(f"{'->' if folder == run_dir else '  '} {folder}: step {s['step']}, phase {s['phase']}, "
              f"evaluated {sorted(s['evals'])}")
print(f"this run: step {run.step} of {cfg.train.steps}; Run all continues it, FRESH_RUN = True starts another")
server.stop()  # the company server: run its cell (section 1) again before re-running the cells above
