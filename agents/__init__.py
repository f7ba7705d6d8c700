"""Agents: planner/coder pairs that propose kernel variants (embedded offline or LLM)."""
