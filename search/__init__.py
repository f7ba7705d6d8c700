"""The search engine: population of agents, selection, tuning, records and the CLI."""
