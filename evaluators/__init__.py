"""Evaluators: compile, validate and time kernel variants; sandboxed GPU execution."""
