"""Tasks: the Scenario type and its files, what a server offers (schema, samples), grounded and LLM-written scenarios, answer balance, demonstration plans."""
