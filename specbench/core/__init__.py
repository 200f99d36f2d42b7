"""Shared basics: errors, sampling, stopping, timing, the question and answer formats, prompts."""
