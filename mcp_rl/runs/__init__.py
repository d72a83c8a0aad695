"""Runs: Config and its flags, what a run is built from, the pipeline's phases, Run and its folder, callbacks, evaluation, the CPU demo, the imitation baseline."""
