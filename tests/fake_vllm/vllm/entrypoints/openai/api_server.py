"""A stand-in for vLLM's OpenAI-compatible server, for the fast tests of backend=vllm: the same
command line (the options specbench passes), /health, /version, /v1/models, /metrics in Prometheus
text with the spec-decode counters, and /v1/completions streaming token ids. Its "model" is a
fixed rule (the next token from the last two), so answers repeat; under --speculative-config it
drafts `num_speculative_tokens` tokens per step and accepts the first of them, and counts so.

FAKE_VLLM_MODE (environment): "exit-at-start" exits before listening; "die-after=N" exits after
N completions; "refuse-long=N" answers HTTP 400 to prompts longer than N tokens; "slow=S" waits S
seconds before answering; "merge-chunks" streams two engine steps per chunk."""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
for flag in ("--model", "--served-model-name", "--host", "--port", "--dtype", "--max-model-len", "--seed",
             "--speculative-config"):
    parser.add_argument(flag)
args, _ = parser.parse_known_args()
MODE = os.environ.get("FAKE_VLLM_MODE", "")
if MODE == "exit-at-start":
    print("RuntimeError: the fake engine refuses to start", flush=True)
    sys.exit(3)
with open(os.path.join(args.model, "config.json")) as fh:
    config = json.load(fh)
VOCAB, EOS = int(config["vocab_size"]), config.get("eos_token_id")
SPEC = json.loads(args.speculative_config) if args.speculative_config else None
K = int(SPEC["num_speculative_tokens"]) if SPEC else 0
COUNTS = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "generated": 0, "per_pos": [0] * K}
LOCK = threading.Lock()
SERVED = {"n": 0}


def next_token(ids):
    token = (ids[-1] * 7 + ids[-2] * 3 + 5) % VOCAB if len(ids) > 1 else 5
    return token + 1 if token == EOS else token


def metrics_text():
    lines = []
    labels = f'engine="0",model_name="{args.served_model_name}"'
    with LOCK:
        c = dict(COUNTS, per_pos=list(COUNTS["per_pos"]))
    lines.append("# TYPE vllm:generation_tokens counter")
    lines.append(f"vllm:generation_tokens_total{{{labels}}} {float(c['generated'])}")
    if SPEC:
        for name, key in (("drafts", "drafts"), ("draft_tokens", "draft_tokens"), ("accepted_tokens", "accepted")):
            lines.append(f"# TYPE vllm:spec_decode_num_{name} counter")
            lines.append(f"vllm:spec_decode_num_{name}_total{{{labels}}} {float(c[key])}")
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
        for pos, value in enumerate(c["per_pos"]):
            name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            lines.append(f'{name}{{{labels},position="{pos}"}} {float(value)}')
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *a):
        pass

    def reply(self, code, body, kind="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.reply(200, "")
        elif self.path == "/version":
            self.reply(200, {"version": "0.0-fake"})
        elif self.path == "/v1/models":
            self.reply(200, {"data": [{"id": args.served_model_name}]})
        elif self.path == "/metrics":
            self.reply(200, metrics_text(), "text/plain; version=0.0.4")
        else:
            self.reply(404, {"error": {"message": "not found"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = list(body["prompt"])
        if MODE.startswith("refuse-long=") and len(prompt) > int(MODE.split("=")[1]):
            self.reply(400, {"error": {"message": f"prompt of {len(prompt)} tokens is too long"}})
            return
        if MODE.startswith("slow="):
            time.sleep(float(MODE.split("=")[1]))
        stops = set(body.get("stop_token_ids") or [])
        ids, out, chunks = list(prompt), [], []
        steps = []  # tokens emitted by each decoding step (the prefill's first token is not one)
        while len(out) < body["max_tokens"] and not (out and out[-1] in stops):
            want = 1 if not out or not K else min(2, body["max_tokens"] - len(out))
            emitted = 0
            for _ in range(want):
                ids.append(next_token(ids))
                out.append(ids[-1])
                emitted += 1
                if ids[-1] in stops:
                    break
            chunks.append(out[-emitted:])  # one streamed chunk per engine step, as vLLM
            if len(out) > emitted:  # not the prefill's token
                steps.append(emitted)
        with LOCK:
            COUNTS["generated"] += len(out)
            if K:
                COUNTS["drafts"] += len(steps)
                COUNTS["draft_tokens"] += len(steps) * K
                accepted = sum(s - 1 for s in steps)
                COUNTS["accepted"] += accepted
                COUNTS["per_pos"][0] += accepted
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        merged = MODE == "merge-chunks"  # a loaded server: two engine steps in one chunk
        if merged:
            chunks = [sum(chunks[i : i + 2], []) for i in range(0, len(chunks), 2)]
        for i, tokens in enumerate(chunks):
            last = i == len(chunks) - 1
            reason = ("stop" if tokens[-1] in stops else "length") if last else None
            chunk = {"choices": [{"index": 0, "text": "".join(f"<{t}>" for t in tokens), "token_ids": tokens,
                                  "finish_reason": reason}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        SERVED["n"] += 1
        if MODE.startswith("die-after=") and SERVED["n"] >= int(MODE.split("=")[1]):
            os._exit(1)


if __name__ == "__main__":
    server = ThreadingHTTPServer((args.host or "127.0.0.1", int(args.port)), Handler)
    server.serve_forever()
