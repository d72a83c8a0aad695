"""Rewards: scoring a group (verified answers, RULER, shaping), answer checking, the grounding evidence, counterfactual replay, the reward audit."""
