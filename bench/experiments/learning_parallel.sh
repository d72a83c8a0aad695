#!/bin/bash
# Several bench/experiments/learning_proof.py runs side by side on one GPU, each in its own process with its own
# log: a small model leaves most of an H200 idle, and device time is the scarce thing. Runs share the
# GPU and the CPU, so each one's GRPO steps are slower than alone (the step seconds in its
# metrics.jsonl say by how much); bench/RESULTS.md reports which runs shared a machine. Mind the memory:
# measured peaks per run are 38.6-38.9 GiB (Gemma 3 270M, set by its update, section 16) and 23-32 GiB (SmolLM2),
# so an 80 GB H100 holds one Gemma run (three side by side ran out of memory there, section 14) and an H200 two. The last thing a
# call does is write $OUT/learning.tgz: wait for that file (`pgrep -f` also matches the waiting command).
#
# On the GPU box, from the repo root, after the bundle's calls, each followed by .dev/gpu/setup.sh (bench/RESULTS.md):
#   bash bench/experiments/learning_parallel.sh DEADLINE_S RUN [RUN ...]
#   RUN = name:config:seed[:FIELD=VALUE,FIELD=VALUE...]
#   A RUN named <name>-imitation is run <name>'s imitation baseline (issue 40, learning_proof.py --baseline
#   imitation; give it the same config, seed and FIELD=VALUEs, after <name>'s spec): it starts from the warm start
#   run <name> forks into $LP_RUNS/<name>-imitation, so where that fork is not there yet it waits for it while
#   <name> runs in the same call (then gets what is left of the deadline), and it spends --train-budget-s on
#   supervised updates instead of GRPO steps.
#   e.g. bash bench/experiments/learning_parallel.sh 540 smollm2-seed0:bench/experiments/learning/smollm2.yaml:0 \
#          smollm2-fp16-seed0:bench/experiments/learning/smollm2.yaml:0:train.precision=fp16
# Each call pauses its runs at the deadline (learning_proof.py --pause) and the next call resumes
# every run whose folder $LP_RUNS/<name> (default /tmp/runs/<name>) exists; a finished run is skipped. A machine
# can be gone by the next call, so each paused run also leaves as $OUT/state/<name>.tgz.NN parts (bench/device/run_state.py:
# its last checkpoint, its folder, its logs; 51.9 MiB for SmolLM2 in session 16): copy them into .dev/gpu/state/ here and carry that
# folder with setup.sh, in a call of its own, to a fresh machine, whose .dev/gpu/setup.sh rebuilds the run folder. Logs go to $LP_RUNS/logs/<name>-<n>.log,
# finished runs' results (their logs as run-call<n>.log) to $LP_RUNS/results/<name>/, and this call's logs and
# results to $OUT/learning.tgz: with the parts, at most the 8 files a call returns. LP_ARGS adds arguments to
# every run (a CPU rehearsal: LP_ARGS="--random-weights TOKENIZER_DIR --random-shape tiny"). Where processes
# outlive a call (started with setsid), LP_PAUSE= (empty) runs each to its end in one go, no pause/resume:
#   OUT=/tmp/out LP_PAUSE= setsid nohup bash bench/experiments/learning_parallel.sh 1400 RUN... >/tmp/lp.log 2>&1 &
set -uo pipefail
usage="usage: bash bench/experiments/learning_parallel.sh DEADLINE_S name:config:seed[:FIELD=VALUE,...] ..."
[ $# -ge 2 ] && [[ $1 =~ ^[0-9]+$ ]] || { echo "$usage" >&2; exit 2; }
deadline=$1; shift
for spec in "$@"; do  # every spec checked before any run starts: a typo costs no device time
  IFS=: read -r name config seed sets <<<"$spec"
  if ! [[ $name =~ ^[A-Za-z0-9._-]+$ && -f $config && $seed =~ ^[0-9]+$ ]]; then
    echo "bad run spec '${spec:0:80}': want name:config:seed[:FIELD=VALUE,...] with an existing config file" \
      "and an integer seed" >&2
    exit 2
  fi
done
OUT=${OUT:-/tmp/out}
RUNS=${LP_RUNS:-/tmp/runs}  # run folders (checkpoints): kept between calls
LOGS=$RUNS/logs RESULTS=$RUNS/results
mkdir -p "$OUT" "$LOGS" "$RESULTS"
# The company database once, before the runs' servers start (they would otherwise race to build it).
python3 -c "import mcp_server; mcp_server.CompanyDB()._ensure()"
launch() {  # name config seed sets deadline_s [learning_proof.py arguments...]: one run, in the background
  local name=$1 config=$2 seed=$3 sets=$4 left=$5; shift 5
  local n; n=$(ls "$LOGS" | grep -c "^$name-[0-9]*\.log$") || true
  local log=$LOGS/$name-$((n + 1)).log
  python3 bench/experiments/learning_proof.py --config "$config" --seed "$seed" --out "$RUNS/$name" --deadline-s "$left" \
    ${LP_PAUSE---pause} "$@" --target-base 0.15 --target-warm-start 0.05 --train-budget-s 900 \
    --results "$RESULTS" ${LP_ARGS:-} --set ${sets//,/ } >"$log" 2>&1 &
  launched=$!
  echo "$name: started (pid $launched, ${*:-new}), log $log"
}
pids=()
declare -A started=()
for spec in "$@"; do
  IFS=: read -r name config seed sets <<<"$spec"
  dir=$RUNS/$name
  if [ -f "$dir/proof.json" ]; then echo "$name: finished"; continue; fi
  resume=(); [ -f "$dir/state.json" ] && resume=(--resume)
  if [[ $name == *-imitation ]]; then  # run <name>'s imitation baseline, from the warm start that run forked
    rl=${name%-imitation}
    if [ ! -f "$dir/state.json" ] && { [ -n "${started[$rl]:-}" ] || [ -f "$RUNS/$rl/state.json" ]; }; then
      if [ -z "${started[$rl]:-}" ]; then
        echo "$name: waiting for $rl's warm start (its fork, $dir), and $rl is not running in this call: skipped"
        continue
      fi
      echo "$name: waiting for $rl's warm start (its fork, $dir)"
      (  # starts once the fork is there, with what is left of the deadline; gives up if $rl ends first
        t0=$SECONDS
        while [ ! -f "$dir/state.json" ]; do
          kill -0 "${started[$rl]}" 2>/dev/null || { echo "$name: $rl ended without a fork: not started"; exit 0; }
          [ $((SECONDS - t0 + 60)) -lt "$deadline" ] || { echo "$name: no fork before the deadline: not started"; exit 0; }
          sleep 5
        done
        launch "$name" "$config" "$seed" "$sets" $((deadline - (SECONDS - t0))) --resume --baseline imitation
        wait "$launched"
      ) &
      pids+=($!)
      continue
    fi
    launch "$name" "$config" "$seed" "$sets" "$deadline" "${resume[@]}" --baseline imitation
  else
    launch "$name" "$config" "$seed" "$sets" "$deadline" "${resume[@]}"
  fi
  pids+=("$launched")
  started[$name]=$launched
  sleep 3  # staggered: each run picks a free port for its server
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
logs=() results=()
for spec in "$@"; do
  name=${spec%%:*}
  dir=$RUNS/$name
  last=$(ls -t "$LOGS"/"$name"-[0-9]*.log 2>/dev/null | head -1)
  [ -n "$last" ] && { echo "== $name"; tail -n 4 "$last"; logs+=("logs/${last##*/}"); }
  if [ -f "$dir/proof.json" ] && [ -d "$RESULTS/$name" ]; then
    for f in "$LOGS"/"$name"-[0-9]*.log; do k=${f##*-}; cp "$f" "$RESULTS/$name/run-call$k"; done
    results+=("results/$name")
  elif [ -f "$dir/state.json" ]; then  # paused (or stopped): its state leaves with the call
    python3 bench/device/run_state.py pack "$dir" "$OUT/state" --logs "$LOGS"/"$name"-[0-9]*.log || status=1
  fi
done
# The device tool returns only so many files a call: this call's logs and finished results in one archive.
tar czf "$OUT/learning.tgz" -C "$RUNS" "${logs[@]}" "${results[@]}"
files=$(find "$OUT" -type f | wc -l)
[ "$files" -le 8 ] || echo "WARNING: $files files under $OUT: a call returns at most 8 (pause fewer runs per call)" >&2
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
exit $status
