"""Build the notebooks from the cells below, so every cell is reviewable Python in one file.

    python notebooks/build_notebooks.py           # rewrite notebooks/*.ipynb (outputs stripped)
    python notebooks/build_notebooks.py --check   # exit 1 if a committed notebook differs from this file

01_train_sql_agent.ipynb: the tutorial, train a SQL agent on this repo's company server.
02_bring_your_own_server.ipynb: the same pipeline pointed at any MCP server, with your own reward.
Each has a cell tagged "parameters" (papermill), so CI runs it on a CPU with the embedded model
(tests/test_notebooks.py) and Colab runs it on a T4 with Qwen2.5-3B-Instruct. Cells only call
the public API of mcp_rl (mcp_rl.__all__); the work is in the library.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
REPO_URL = "https://github.com/OWNER/mcp-rl"  # placeholder: the lead sets the real owner
COLAB = "https://colab.research.google.com/github/OWNER/mcp-rl/blob/main/notebooks/"
BADGE = "https://colab.research.google.com/assets/colab-badge.svg"


def md(text: str) -> tuple:
    return ("markdown", textwrap.dedent(text).strip(), [])


def code(text: str, *tags: str) -> tuple:
    return ("code", textwrap.dedent(text).strip(), list(tags))


def badge(name: str) -> str:
    return f"[![Open In Colab]({BADGE})]({COLAB}{name})"


# The same install cell in both notebooks. The pins live in pyproject.toml's `colab` extra;
# triton 3.2.0 is a second step, as in ART's T4 notebooks (torch 2.7.0 pins triton 3.3.0, so
# one resolve with both fails). tests/test_notebooks.py checks this cell against pyproject.
INSTALL = code(f'''
    # Install (Colab): clone mcp-rl and install it with the `colab` extra
    # (openpipe-art[backend] 0.4.11, vLLM 0.9.2, Unsloth 2025.8.6, bitsandbytes), then triton 3.2.0.
    # This takes several minutes on Colab: vLLM and its torch are large downloads.
    # Skipped wherever mcp_rl is already importable (CI, a local checkout with `pip install -e .`).
    import importlib.util

    REPO_URL = "{REPO_URL}"
    if importlib.util.find_spec("mcp_rl") is None:
        !git clone --depth 1 {{REPO_URL}} mcp-rl
        %cd mcp-rl
        !pip install -q -e ".[colab]"
        !pip install -q triton==3.2.0
    else:
        print("mcp_rl is already installed: skipping the install")
''')

KEY_CELL = code('''
    # Keys come from Colab secrets (the key icon on the left) or the environment, else a hidden prompt
    # (press Enter to skip). They are never printed, and never written into the notebook or the run folder.
    from mcp_rl import get_secret

    KEY = get_secret("OPENROUTER_API_KEY", prompt=True, export=True)
    if KEY:
        print(f"OPENROUTER_API_KEY found: LLM scenarios and the RULER judge ({JUDGE_MODEL}) are on")
    else:
        print("No OPENROUTER_API_KEY: continuing without an LLM, with verifiable rewards only (judge off)")
''')

SAVE_TIPS = md('''
    ## Save the adapter and the merged model

    The portable trainer writes the LoRA adapter (`adapter/`, loadable with peft), the optimizer and
    its step (`trainer.save`), and a merged Hugging Face model ready to serve with vLLM or to
    convert for llama.cpp (`trainer.merge_and_save`). ART keeps the LoRA of every step itself, under
    `<OUT>/.art/<project>/models/<name>/checkpoints/<step>` (`trainer.checkpoint_dir()`); that folder
    is a peft adapter for the base model (merge it with peft's `merge_and_unload` on a machine with
    the memory for the full-precision model). Set `HF_REPO` to push the result to the Hugging Face
    Hub (a private repository; the token comes from the `HF_TOKEN` secret). Off by default.
''')

SAVE = code('''
    final = trainer.save(run_dir / "final")  # portable: adapter/ + optimizer; ART: which step and where
    if hasattr(trainer, "merge_and_save"):
        export = trainer.merge_and_save(run_dir / "merged")
        print("adapter:", final / "adapter", "| merged model:", export)
    else:
        export = trainer.checkpoint_dir()
        print("ART's LoRA checkpoint for step", trainer.step, "is in", export)

    if HF_REPO:
        from huggingface_hub import HfApi

        hub = HfApi(token=get_secret("HF_TOKEN", prompt=True))
        hub.create_repo(HF_REPO, private=True, exist_ok=True)
        hub.upload_folder(folder_path=str(export), repo_id=HF_REPO)
        print(f"pushed {export} to https://huggingface.co/{HF_REPO}")
''')

REPORT = code('''
    from IPython.display import Image, Markdown, display

    from mcp_rl import write_report

    report = write_report(run_dir, results, state["history"], title=f"{cfg.model} on {SERVER_NAME}")
    # The plots are shown below as images; their Markdown links only resolve next to the file.
    display(Markdown("\\n".join(l for l in report.read_text().splitlines() if not l.startswith("!["))))
    for png in sorted(run_dir.glob("*.png")):
        display(Image(filename=str(png)))
''')


TUTORIAL = [
    md(f'''
        # Train a SQL agent on an MCP server with RL

        {badge("01_train_sql_agent.ipynb")}

        This notebook teaches a small open model, **Qwen2.5-3B-Instruct in 4 bits** on a free Colab T4,
        to answer questions about a company database by calling the tools of an MCP server
        (`list_tables`, `describe_table`, `run_query`). Every step is one call into `mcp_rl`:
        start the server, read its tools and schema, get training tasks, roll the model out against
        the real server, score each group of rollouts (verified answers, plus the RULER judge when you
        have an OpenRouter key), train with GRPO through OpenPipe ART, and compare the model before and
        after on the same held-out questions.

        In Colab choose *Runtime → Change runtime type → T4 GPU*, then run the cells in order. The same
        notebook runs on a CPU with the embedded SmolLM2-135M model (`PRESET = "cpu"`, `MODEL = "smollm2"`):
        that is how CI executes it, with tiny settings.
    '''),
    INSTALL,
    md('''
        ## Settings

        The next cell holds every setting (papermill replaces it in CI). `PRESET = "t4"` trains with ART
        (vLLM serves the model, Unsloth trains a LoRA); `"cpu"` uses the portable transformers + peft
        trainer. Tips that matter on a T4:

        - **float16**: a T4 has no bfloat16; the ART trainer loads vLLM and Unsloth in float16.
        - **A sane max sequence length**: the `t4` preset trains on trajectories up to 8192 tokens, what
          ART's own T4 notebooks use. If vLLM runs out of memory, lower it
          (`cfg.train.max_seq_len = 4096`) and keep `MAX_TURNS` and `MAX_TOKENS` modest.
        - **More rollouts per group when rewards show no variance**: GRPO learns only from differences
          between rollouts of the same task. A line "every group had zero reward variance" means raise
          `GROUP_SIZE`.
    '''),
    code('''
        # Parameters (papermill overrides these; CI: PRESET="cpu", MODEL="smollm2", tiny steps)
        PRESET = "t4"                        # t4: ART + vLLM on a Colab T4, cpu: the portable trainer
        MODEL = "Qwen/Qwen2.5-3B-Instruct"   # 4-bit on the T4, or smollm2: the embedded CPU model
        STEPS = 20                           # GRPO steps
        GROUPS_PER_STEP = 4                  # scenarios (tasks) per step
        GROUP_SIZE = 6                       # rollouts per scenario, compared with each other
        EVAL_SCENARIOS = 60                  # held-out scenarios, the same before and after
        WARM_START = None                    # demonstrations for a warm start, None: as the preset says
        MAX_TOKENS = 512                     # new tokens per assistant turn
        MAX_TURNS = 8                        # assistant turns per episode
        JUDGE_MODEL = "openrouter/openai/gpt-4.1-mini"  # RULER judge (litellm name), only with a key
        GENERATOR_MODEL = "openai/gpt-4.1-mini"         # scenario writer on OpenRouter, only with a key
        LLM_SCENARIOS = 40                   # extra LLM-written training tasks when a key exists
        OUT = "runs/sql-agent"               # run folder: checkpoints, metrics, report, plots
        HF_REPO = None                       # a Hub repository such as you/sql-agent to push the model to
        SEED = 0
    ''', "parameters"),
    KEY_CELL,
    code('''
        from pathlib import Path

        from mcp_rl import preset

        train_settings = {"steps": STEPS, "groups_per_step": GROUPS_PER_STEP, "group_size": GROUP_SIZE,
                          "eval_scenarios": EVAL_SCENARIOS, "seed": SEED}
        if WARM_START is not None:
            train_settings["warm_start_scenarios"] = WARM_START
        cfg = preset(PRESET, model=MODEL, out=OUT, train=train_settings,
                     rollout={"max_tokens": MAX_TOKENS, "max_turns": MAX_TURNS},
                     reward={"judge_model": JUDGE_MODEL if KEY else None})
        run_dir, SERVER_NAME = Path(cfg.out), "the company MCP server"
        print(f"{cfg.model} | {cfg.train.backend} trainer | {cfg.train.steps} steps of "
              f"{cfg.train.groups_per_step} x {cfg.train.group_size} rollouts | judge {cfg.reward.judge_model}")
        print("system prompt:", cfg.rollout.system_prompt)
    '''),
    md('''
        The system prompt tells the model that **the database works and the tools must be used**: a small
        model left alone tends to apologise that it "cannot access databases" and guess.

        ## 1. Start the MCP server and look at its tools

        `mcp_server.py` serves a read-only SQLite company database (departments, employees, projects).
        It runs as a separate process over streamable HTTP on 127.0.0.1, a real MCP transport, and stays
        up until the last cell. The agent sees exactly these JSON schemas, plus `complete_task(answer)`.
    '''),
    code('''
        import atexit

        from mcp_rl import HttpServer, company_server_command, tools_json

        server = HttpServer(company_server_command()).start()
        atexit.register(server.stop)  # also stopped when the kernel exits
        print("MCP server:", server.url)
        print(await tools_json(server.spec))
    '''),
    md('''
        ## 2. Enrich the tool schemas

        `run_query(sql)` says nothing about which tables exist, so a model (or a scenario writer) shown
        only that schema invents table names. `collect_context` reads the real schema, row counts and
        sample rows through the server's own tools; `enrich_tools` adds the schema to the SQL tool's
        description.
    '''),
    code('''
        from mcp_rl import ToolSession, collect_context, enrich_tools

        async with ToolSession(server.spec) as session:
            ctx = await collect_context(session)
        print(ctx.as_text()[:1500], "\\n...")
        sql_tool = next(t for t in enrich_tools(ctx.tools, ctx) if t["function"]["name"] == ctx.sql_tool[0])
        print("\\nenriched description:", sql_tool["function"]["description"][:400])
    '''),
    md('''
        ## 3. Scenarios

        The repository ships `data/scenarios.jsonl`: questions written from SQL templates over the live
        schema, each with an answer computed through the server, split into train / val / test. With a
        key, an LLM (through ART's `generate_scenarios`) writes extra training tasks from the enriched
        context; tasks naming tables or columns that do not exist are rejected. LLM tasks have no verified
        answer, so the RULER judge scores them; evaluation always uses the verified test split.
    '''),
    code('''
        from mcp_rl import llm_scenarios, load_splits

        train, val, test = load_splits(cfg)  # verified: train / val / test of data/scenarios.jsonl
        generated = []
        if KEY and LLM_SCENARIOS:
            try:
                generated = await llm_scenarios(ctx, LLM_SCENARIOS, generator_model=GENERATOR_MODEL,
                                                out_path=run_dir / "llm_scenarios.jsonl", seed=SEED)
            except (RuntimeError, ValueError) as e:  # keep what was accepted; the committed set suffices
                generated = getattr(e, "scenarios", [])
                print("LLM scenario generation stopped:", e)
        print(f"{len(train)} verified training, {len(generated)} LLM-written, {len(test)} held-out test scenarios")
        for s in test[:3] + generated[:3]:
            print(f"- {s.task}  ->  {s.answer!r}")
    '''),
    md('''
        ## 4. The model and its trainer

        `build_trainer` loads the policy and its trainer from the config. With ART (`t4`) the model is
        registered with a LocalBackend, which starts vLLM and Unsloth on the GPU (a few minutes the first
        time: it downloads the model). With the portable trainer (`cpu`) the model is a local transformers
        model with a LoRA adapter.
    '''),
    code('''
        from mcp_rl import build_trainer

        trainer = build_trainer(cfg)
        if hasattr(trainer, "register"):  # ART on Colab: starts vLLM + Unsloth
            await trainer.register()
        print(type(trainer).__name__, "| policy", trainer.policy.name, "| step", trainer.step)
    '''),
    md('''
        ## 5. One rollout of the base model

        A rollout is one episode: the task, the model's turns, each tool call run on the server and its
        result, until the model calls `complete_task` or runs out of turns. Errors (bad SQL, a malformed
        call) come back to the model as messages it can learn from.
    '''),
    code('''
        from mcp_rl import rollout, score_trajectory, transcript

        traj = await rollout(trainer.policy, server.spec, test[0], cfg.rollout)
        score_trajectory(traj, test[0], cfg.reward)
        print(transcript(traj))
        print("expected:", test[0].answer)
    '''),
    md('''
        ## 6. Evaluate the base model on held-out scenarios

        Greedy decoding on the test split; a scenario counts as solved when the verified answer gets full
        credit. The same scenarios are evaluated again after training.
    '''),
    code('''
        from mcp_rl import evaluate_policy

        base = await evaluate_policy(trainer.policy, server.spec, test, cfg, "base", run_dir)
        results = [base]
    '''),
    md('''
        ## 7. Warm start (when the preset asks for it)

        The 135M CPU model never emits a tool call on its own, so RL would find no reward. The `cpu`
        preset first fine-tunes it on demonstrations: scripted solutions of *training* scenarios, each
        played through the real server so tool outputs are real. The 3B model on the T4 needs none.
    '''),
    code('''
        from mcp_rl import warm_start

        state = {"step": 0, "history": [], "phase": "training"}
        if cfg.train.warm_start_scenarios:
            state["history"].append({"step": 0, "phase": "warm_start",
                                     **await warm_start(trainer, server.spec, train, cfg)})
            results.append(await evaluate_policy(trainer.policy, server.spec, test, cfg, "warm_start", run_dir))
        else:
            print("no warm start for this preset")
    '''),
    md('''
        ## 8. Train

        Each step: `GROUPS_PER_STEP` training scenarios, `GROUP_SIZE` rollouts of each (progress bars),
        rewards for every group (verified answer + small shaping terms, plus RULER with a key), groups
        whose rollouts all scored the same are skipped (no signal for GRPO), then one LoRA update.
        A line per step reports the mean reward and verified success; every step is checkpointed in
        `OUT/checkpoints`.
    '''),
    code('''
        from mcp_rl import train_loop

        state = await train_loop(trainer, server.spec, train + generated, cfg, run_dir, state, val)
    '''),
    md('''
        ## 9. Evaluate the trained model and plot

        The same held-out scenarios as step 6. `write_report` writes `report.md`, `summary.json` and the
        plots into the run folder.
    '''),
    code('''
        trained = await evaluate_policy(trainer.policy, server.spec, test, cfg, "trained", run_dir)
        results.append(trained)
        print(f"verified success: base {base.success_rate:.0%} -> trained {trained.success_rate:.0%} (n={trained.n})")
    '''),
    REPORT,
    SAVE_TIPS,
    SAVE,
    code('''
        server.stop()
    '''),
]


BYOS = [
    md(f'''
        # Bring your own MCP server

        {badge("02_bring_your_own_server.ipynb")}

        The tutorial's pipeline, pointed at any MCP server: a stdio command (`uvx mcp-server-time`,
        `npx -y @scope/server`, `python my_server.py`) or an HTTP URL (`https://host/mcp`). The example is
        the reference **time** server (`get_current_time`, `convert_time`). You bring:

        - the server (`SERVER`);
        - tasks: hand-written below, plus LLM-written ones validated against the server when you have an
          OpenRouter key;
        - a reward: the verified answers of your hand-written tasks, RULER (with a key), and a reward
          function you write yourself in step 4.

        CI runs this notebook on a CPU with the embedded SmolLM2-135M model against
        `python -m mcp_server_time`.
    '''),
    INSTALL,
    md('''
        ## Settings

        `TRAIN_TASKS` and `TEST_TASKS` are `(task, answer)` pairs; `answer` is what a correct final answer
        must contain, or `None` when it cannot be known in advance ("what time is it now in Paris?").
        Only tasks with an answer can be evaluated. The conversions below use time zones without daylight
        saving time, so their answers never change. `TOOL_PREFIX = True` forces each turn to start with a
        tool call: an aid for tiny models that never emit one on their own (CI's CPU model).
    '''),
    code('''
        # Parameters (papermill overrides these; CI: the embedded model against python -m mcp_server_time)
        SERVER = "uvx mcp-server-time"        # a stdio command, a .py file, or an http(s)://.../mcp URL (uvx: pip install uv)
        TOKEN_SECRET = None                    # name of a secret holding a bearer token (HTTP servers)
        PRESET = "t4"                          # t4: ART on a Colab T4, cpu: the portable trainer
        MODEL = "Qwen/Qwen2.5-3B-Instruct"     # or smollm2: the embedded CPU model
        TOOL_PREFIX = False                    # force a tool call at the start of each turn (tiny models)
        STEPS = 10
        GROUPS_PER_STEP = 4
        GROUP_SIZE = 6
        EVAL_SCENARIOS = 20
        MAX_TOKENS = 256
        MAX_TURNS = 4
        CUSTOM_WEIGHT = 0.5                    # weight of your reward function, 0 logs it only
        JUDGE_MODEL = "openrouter/openai/gpt-4.1-mini"
        GENERATOR_MODEL = "openai/gpt-4.1-mini"
        LLM_SCENARIOS = 20
        OUT = "runs/my-server"
        HF_REPO = None
        SEED = 0
        TRAIN_TASKS = [
            ("It is 09:15 in Etc/UTC. What time is it in Asia/Tokyo? Answer as HH:MM.", "18:15"),
            ("What time is it in Asia/Kolkata when it is 12:00 in Etc/UTC? Answer as HH:MM.", "17:30"),
            ("Convert 20:40 from Asia/Shanghai to Etc/UTC. Answer as HH:MM.", "12:40"),
            ("A call is at 08:00 in America/Bogota. What time is that in Asia/Dubai? Answer as HH:MM.", "17:00"),
            ("Convert 23:10 in Asia/Singapore to Africa/Nairobi time. Answer as HH:MM.", "18:10"),
            ("What time is it now in Europe/Paris? Answer as HH:MM.", None),
            ("What is the current time in America/New_York? Answer as HH:MM.", None),
        ]
        TEST_TASKS = [
            ("It is 14:30 in Etc/UTC. What time is it in Asia/Tokyo? Answer as HH:MM.", "23:30"),
            ("Convert 06:45 from Asia/Kathmandu to Etc/UTC. Answer as HH:MM.", "01:00"),
            ("What time is it in Pacific/Honolulu when it is 22:00 in Etc/UTC? Answer as HH:MM.", "12:00"),
            ("A meeting is at 16:20 in Asia/Jakarta. What time is that in America/Lima? Answer as HH:MM.", "04:20"),
            ("Convert 10:05 in Africa/Lagos to Asia/Seoul. Answer as HH:MM.", "18:05"),
        ]
    ''', "parameters"),
    KEY_CELL,
    md('''
        ## 1. Connect to the server and look at its tools

        A stdio command is started once per rollout (each rollout holds one session); an HTTP URL is
        connected to. `collect_context` reads the tools and resources; for a server that runs SQL it also
        reads the schema, as in the tutorial.
    '''),
    code('''
        from mcp_rl import ToolSession, collect_context, tools_json

        spec = SERVER if not TOKEN_SECRET else {"url": SERVER, "token": get_secret(TOKEN_SECRET, prompt=True)}
        print(await tools_json(spec))
        async with ToolSession(spec) as session:
            ctx = await collect_context(session)
        print(ctx.as_text()[:1200])
    '''),
    md('''
        ## 2. Tasks

        Hand-written tasks become `Scenario`s. With a key, `llm_scenarios` asks an LLM for more, shown
        the server's tools; tasks that name tools the server lacks are rejected. They have no answer,
        so they are used for training only, scored by RULER and your reward.
    '''),
    code('''
        from mcp_rl import Scenario, llm_scenarios

        train = [Scenario(id=f"train-{i:02d}", task=t, answer=a, split="train") for i, (t, a) in enumerate(TRAIN_TASKS)]
        test = [Scenario(id=f"test-{i:02d}", task=t, answer=a, split="test") for i, (t, a) in enumerate(TEST_TASKS)]
        test = [s for s in test if s.answer is not None][:EVAL_SCENARIOS]
        if KEY and LLM_SCENARIOS:
            try:
                train += await llm_scenarios(ctx, LLM_SCENARIOS, generator_model=GENERATOR_MODEL, seed=SEED)
            except (RuntimeError, ValueError) as e:
                train += getattr(e, "scenarios", [])
                print("LLM scenario generation stopped:", e)
        print(f"{len(train)} training tasks ({sum(s.answer is None for s in train)} without an answer), {len(test)} test tasks")
        for s in train[-3:]:
            print(f"- {s.task}  ->  {s.answer!r}")
    '''),
    md('''
        ## 3. Your reward function

        A reward function takes the finished trajectory and its scenario and returns a number.
        `traj.metadata["answer"]` is the final answer, `traj.messages()` the conversation (tool results
        have `role == "tool"`), `traj.metrics` the counts (`tool_calls`, `tool_errors`, `completed`...).
        It joins the built-in components in `RewardConfig.custom` as `(name, fn, weight)`: the reward is
        the weighted sum, a weight of 0 only logs it (`reward/<name>` in the metrics), and an exception in
        your function scores 0 with the error in `traj.logs`; it never stops training.

        For the time server: reward an answer that names a time (HH:MM) which a tool actually returned,
        so the model learns to read times from the tools instead of inventing them. This also scores the
        "what time is it now" tasks that have no fixed answer.
    '''),
    code('''
        import re

        HHMM = re.compile(r"\\b([01]?\\d|2[0-3]):([0-5]\\d)\\b")


        def time_from_a_tool(traj, scenario) -> float:
            """1.0 when the final answer names a time (HH:MM) that appears in a tool result, else 0.0."""
            answer = str(traj.metadata.get("answer") or "")
            tool_text = " ".join(str(m.get("content") or "") for m in traj.messages() if m["role"] == "tool")
            times = [f"{int(h):02d}:{mm}" for h, mm in HHMM.findall(answer)]
            return float(any(t in tool_text for t in times))
    '''),
    code('''
        from mcp_rl import preset

        cfg = preset(PRESET, model=MODEL, server=str(SERVER), tool_prefix=TOOL_PREFIX, out=OUT,
                     rollout={"max_tokens": MAX_TOKENS, "max_turns": MAX_TURNS},
                     reward={"judge_model": JUDGE_MODEL if KEY else None,
                             "custom": [("time_from_tool", time_from_a_tool, CUSTOM_WEIGHT)]},
                     train={"steps": STEPS, "groups_per_step": GROUPS_PER_STEP, "group_size": GROUP_SIZE,
                            "warm_start_scenarios": 0, "seed": SEED})
        print(f"{cfg.model} | {cfg.train.backend} trainer | tool_prefix {cfg.tool_prefix} | judge {cfg.reward.judge_model}")
    '''),
    md('''
        ## 4. Load the model and read one rollout

        The warm start of the tutorial replays SQL demonstrations, which this server has no use for:
        on a CPU, `TOOL_PREFIX = True` gives the tiny model its first tool calls instead.
    '''),
    code('''
        from pathlib import Path

        from mcp_rl import build_trainer, rollout, score_trajectory, transcript

        trainer = build_trainer(cfg)
        if hasattr(trainer, "register"):  # ART on Colab: starts vLLM + Unsloth
            await trainer.register()
        run_dir, SERVER_NAME = Path(cfg.out), SERVER
        traj = await rollout(trainer.policy, spec, test[0], cfg.rollout)
        score_trajectory(traj, test[0], cfg.reward)
        print(transcript(traj))
        print("your reward:", traj.metrics["reward/time_from_tool"], "| expected:", test[0].answer)
    '''),
    md('''
        ## 5. Evaluate, train, evaluate again

        Evaluation uses the test tasks with answers; training uses all training tasks, rewarded by the
        verified answer where there is one, RULER with a key, and `time_from_tool`.
    '''),
    code('''
        from mcp_rl import evaluate_policy, train_loop

        results = [await evaluate_policy(trainer.policy, spec, test, cfg, "base", run_dir)]
        state = await train_loop(trainer, spec, train, cfg, run_dir, {"step": 0, "history": [], "phase": "training"})
        results.append(await evaluate_policy(trainer.policy, spec, test, cfg, "trained", run_dir))
    '''),
    REPORT,
    SAVE_TIPS,
    SAVE,
]

NOTEBOOKS = {"01_train_sql_agent.ipynb": TUTORIAL, "02_bring_your_own_server.ipynb": BYOS}


def build(cells: list[tuple], stem: str) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "accelerator": "GPU",  # Colab opens it on a GPU runtime
        "colab": {"provenance": [], "gpuType": "T4"},
    }
    for i, (kind, source, tags) in enumerate(cells):
        cell = new_markdown_cell(source) if kind == "markdown" else new_code_cell(source)
        cell.id = f"{stem}-{i:02d}"  # fixed ids: rebuilding gives the same file
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(NOTEBOOKS[name], name.split("_")[0]), version=4) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for name in NOTEBOOKS:
        path, text = HERE / name, render(name)
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print("wrote", path)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python notebooks/build_notebooks.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
