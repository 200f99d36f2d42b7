"""Engines specbench did not write, benchmarked on the same questions, files and tables.

`backend=vllm`: a vLLM OpenAI-compatible server per method (started from the backend's command, or
one already running at `backend.url`); the questions' prompts rendered and tokenised as the local
runner does, sent as token ids, each answer streamed and timed, its speculative-decoding acceptance
read from the server's own Prometheus counters as deltas. Layer: beside `run` (it writes the same
answer files), below analysis; it never imports torch models or the engine.
"""
