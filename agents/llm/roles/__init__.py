"""The LLM roles: tester (extra shapes), planner (suggestions), coder (variant files), and the
single-agent prompt that plans and codes at once."""
