"""An OpenAI-compatible completions client for one server: a prompt of token ids in, the answer
streamed back and timed (time to the first token, time to the last), the token ids it generated.

Every failure is a `ServerError` with one line that names the server and what to do: the runner
records a question's own error (`fatal=False`: the server answered, e.g. a prompt too long) and
stops on a server that is gone or silent (`fatal=True`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from specbench.core.errors import SpecbenchError
from specbench.serving import metrics


class ServerError(SpecbenchError):
    def __init__(self, message: str, fatal: bool) -> None:
        super().__init__(message)
        self.fatal = fatal


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    seconds: float  # request sent -> last chunk read
    first_token: float | None  # request sent -> first chunk with a token
    finish_reason: str | None
    chunks: int = 0
    usage: dict[str, Any] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)  # token ids per streamed chunk that carried any, in order


class Client:
    def __init__(self, url: str, model: str, timeout: float = 600.0) -> None:
        self.url, self.model, self.timeout = url.rstrip("/"), model, float(timeout)
        self.http = requests.Session()

    def _get(self, path: str, timeout: float | None = None) -> requests.Response:
        try:
            response = self.http.get(self.url + path, timeout=timeout or self.timeout)
        except requests.RequestException as exc:
            raise ServerError(f"the server at {self.url} did not answer GET {path} ({_why(exc)}); see its log; the "
                              "answers so far are kept: run the same command again to resume", fatal=True) from None
        return response

    def healthy(self) -> bool:
        try:
            return self.http.get(self.url + "/health", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def served_models(self) -> list[str]:
        response = self._get("/v1/models")
        if response.status_code != 200:
            raise ServerError(f"the server at {self.url} answered GET /v1/models with HTTP {response.status_code}",
                              fatal=True)
        return [m.get("id") for m in response.json().get("data", [])]

    def counters(self) -> metrics.Counters:
        response = self._get("/metrics")
        if response.status_code != 200:
            raise ServerError(f"the server at {self.url} answered GET /metrics with HTTP {response.status_code}; "
                              "start vLLM with its statistics on (no --disable-log-stats)", fatal=True)
        return metrics.parse(response.text)

    def complete(self, prompt: list[int], max_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int | None = None, stop: list[str] | None = None,
                 stop_token_ids: list[int] | None = None) -> Completion:
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "max_tokens": int(max_tokens), "temperature": float(temperature),
            "top_p": float(top_p), "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True, "skip_special_tokens": True,
        }
        if top_k:
            body["top_k"] = int(top_k)
        if seed is not None:
            body["seed"] = int(seed)
        if stop:
            body["stop"] = list(stop)
        if stop_token_ids:
            body["stop_token_ids"] = list(stop_token_ids)
        start = time.perf_counter()
        try:
            response = self.http.post(self.url + "/v1/completions", json=body, stream=True, timeout=self.timeout)
        except requests.Timeout:
            raise ServerError(f"the server at {self.url} sent nothing for {self.timeout:g} s; raise "
                              "backend.request_timeout=... or check its log", fatal=True) from None
        except requests.RequestException as exc:
            raise ServerError(f"the server at {self.url} is gone ({_why(exc)}); see its log, then run the same "
                              "command again to resume", fatal=True) from None
        with response:
            if response.status_code != 200:
                raise ServerError(f"the server at {self.url} refused the request: HTTP {response.status_code} "
                                  f"{_message(response)}", fatal=response.status_code >= 500)
            return self._read(response, start)

    def _read(self, response: requests.Response, start: float) -> Completion:
        ids: list[int] = []
        sizes: list[int] = []
        text: list[str] = []
        first = finish = None
        usage: dict[str, Any] = {}
        chunks = 0
        try:
            for line in response.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise ServerError(f"the server at {self.url} failed mid-answer: "
                                      f"{_flat(event['error'])}", fatal=True)
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    got = choice.get("token_ids") or []
                    if got and first is None:
                        first = time.perf_counter() - start
                    if got:
                        sizes.append(len(got))
                    ids += got
                    text.append(choice.get("text") or "")
                    finish = choice.get("finish_reason") or finish
                chunks += 1
        except requests.RequestException as exc:
            raise ServerError(f"the server at {self.url} broke off an answer ({_why(exc)}); see its log, then "
                              "run the same command again to resume", fatal=True) from None
        except json.JSONDecodeError:
            raise ServerError(f"the server at {self.url} streamed something that is not JSON; is it an "
                              "OpenAI-compatible server?", fatal=True) from None
        seconds = time.perf_counter() - start
        if finish is None:
            raise ServerError(f"the server at {self.url} ended an answer without a finish reason (it died?); see "
                              "its log, then run the same command again to resume", fatal=True)
        if chunks and not ids and usage.get("completion_tokens"):
            raise ServerError(f"the server at {self.url} streamed no token ids (return_token_ids): use vLLM 0.10.2 "
                              "or newer", fatal=True)
        return Completion(ids, "".join(text), seconds, first, finish, chunks, usage, sizes)


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip().splitlines()[0][:200] if response.text.strip() else ""
    return _flat(body.get("error", body) if isinstance(body, dict) else body)


def _flat(error: Any) -> str:
    if isinstance(error, dict):
        error = error.get("message", error)
    return " ".join(str(error).split())[:300]
