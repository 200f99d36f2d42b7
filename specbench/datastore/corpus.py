"""Corpora as token ids: the one reader behind REST datastores and head training.

A corpus spec is one of
- a local `.json` / `.jsonl` / `.parquet` / `.csv` file, read by Hugging Face `datasets`
  (streamed: nothing is converted or cached, and it works with HF_HUB_OFFLINE=1);
- any other local file (`.txt`, ...): plain text, documents separated by blank lines;
- a registered `prefix:NAME` such as `zoo:corpus` (the zoo's training conversations);
- a hub dataset id or a local dataset folder: `datasets.load_dataset(spec, split=split)`, cached
  in the `datasets` cache (HF_DATASETS_CACHE, by default under ~/.cache/huggingface).

A record is one document: `{"text": ...}` (or the `text_field` given), a chat
`{"messages": [{"role", "content"}]}`, ShareGPT `{"conversations": [{"from", "value"}]}`, or
Spec-Bench `{"turns": [...], "reference": [...]}`. Chats are rendered with the tokenizer's chat
template when it has one (so the corpus looks like the prompts), else their texts are joined by
newlines. Texts are encoded without added special tokens: a chat template writes its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError

#: file suffix -> the `datasets` builder that reads it
BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
#: ShareGPT speakers -> chat roles (unknown speakers are users)
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
BATCH = 256  # documents tokenized at once


def read_corpus(
    spec: str | os.PathLike, tokenizer: Any, *, split: str = "train", text_field: str | None = None,
    max_tokens: int | None = None,
) -> Iterator[list[int]]:
    """Token ids of each document of a corpus (see the module docstring for `spec`); `split`
    picks the split of a hub dataset; stops once about `max_tokens` tokens have been yielded."""
    source, texts = _texts(str(spec), tokenizer, split, text_field)
    total = n_docs = 0
    while batch := list(islice(texts, BATCH)):
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            if not ids:
                continue
            yield list(ids)
            n_docs += 1
            total += len(ids)
            if max_tokens is not None and total >= max_tokens:
                return
    if not n_docs:
        raise SpecbenchError(f"corpus {source} has no text")


def _texts(spec: str, tokenizer: Any, split: str, text_field: str | None) -> tuple[str, Iterator[str]]:
    """(a name for messages, the documents' texts) of a corpus spec."""
    spec = _resolve(spec)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() in BUILDERS:
            records = _dataset_records(str(path), BUILDERS[path.suffix.lower()], "train", local=True)
            return str(path), _render_records(records, tokenizer, text_field, str(path))
        return str(path), _paragraphs(path)
    if not path.is_dir() and (path.suffix.lower() in {*BUILDERS, ".txt"} or not HUB_ID.match(spec)):
        raise SpecbenchError(f"corpus file {spec} does not exist; give a .json/.jsonl/.parquet/.csv/.txt file, "
                             "a hub dataset id or zoo:corpus")
    source = str(path) if path.is_dir() else spec
    records = _dataset_records(source, None, split, local=False)
    return source, _render_records(records, tokenizer, text_field, source)


def _resolve(spec: str) -> str:
    """`prefix:NAME` through the registered resolvers (specbench.models); other specs as given."""
    prefix, sep, name = spec.partition(":")
    if not sep or not prefix.isidentifier() or os.path.exists(spec):
        return spec
    from specbench.models import find_resolver

    resolve = find_resolver(prefix)
    if resolve is None:
        raise SpecbenchError(f"corpus '{spec}': no resolver is registered for '{prefix}:'; give a file, a hub "
                             "dataset id or zoo:corpus")
    return str(resolve(name))


def _paragraphs(path: Path) -> Iterator[str]:
    """Plain text: documents separated by blank lines."""
    lines: list[str] = []
    with path.open(encoding="utf-8") as fh:
        try:
            for line in fh:
                if line.strip():
                    lines.append(line)
                elif lines:
                    yield "".join(lines).strip()
                    lines = []
        except UnicodeDecodeError:
            raise SpecbenchError(f"corpus file {path} is not UTF-8 text; give a text file or a "
                                 ".json/.jsonl/.parquet/.csv data file") from None
    if lines:
        yield "".join(lines).strip()


def _load_dataset(spec: str, builder: str | None, split: str, local: bool) -> Any:
    import datasets  # heavy: imported only when a corpus needs it

    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its failures become our one-line errors
    if local:  # streamed: read in place, no Arrow copy in the cache, no network
        return datasets.load_dataset(builder, data_files=spec, split="train", streaming=True)
    return datasets.load_dataset(spec, split=split)


def _dataset_records(spec: str, builder: str | None, split: str, local: bool) -> Iterator[Any]:
    """The records of a data file or hub dataset; every failure of `datasets` as one line."""
    what = f"corpus file {spec}" if local else f"corpus '{spec}' as a dataset (split {split})"
    fix = "check the file's format" if local else "give an existing file, or a hub dataset id while online"
    try:  # datasets and pyarrow raise many kinds of errors; each becomes one line naming the corpus
        data = _load_dataset(spec, builder, split, local)
        yield from data
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        raise SpecbenchError(f"cannot read {what}: {first}; {fix}") from None


def _render_records(records: Iterable[Any], tokenizer: Any, text_field: str | None, source: str) -> Iterator[str]:
    for row, record in enumerate(records, 1):
        doc = _document(record, text_field or "text")
        if doc is None:
            fields = ", ".join(f"{k} ({type(v).__name__})" for k, v in sorted(record.items()) if v is not None) \
                if isinstance(record, dict) else type(record).__name__
            raise SpecbenchError(
                f"{source}, row {row}: a record needs '{text_field or 'text'}' (a string), 'messages' "
                "[{role, content}], 'conversations' [{from, value}] (ShareGPT) or 'turns' (+ 'reference') "
                f"(Spec-Bench); this one has {fields or 'no fields'}")
        yield doc if isinstance(doc, str) else _render_chat(doc, tokenizer, f"{source}, row {row}")


def _document(record: Any, text_field: str) -> str | list[dict[str, str]] | None:
    """A record's text, or its conversation as chat messages; None when it has no known shape."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get(text_field), str):
        return record[text_field]
    messages = record.get("messages")
    if isinstance(messages, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                          for m in messages):
        return [{"role": str(m.get("role") or "user"), "content": m["content"]} for m in messages]
    turns = record.get("conversations")
    if isinstance(turns, list) and all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns):
        return [{"role": ROLES.get(str(t.get("from")).lower(), "user"), "content": t["value"]} for t in turns]
    turns = record.get("turns")
    if isinstance(turns, list) and all(isinstance(t, str) for t in turns):
        answers = record.get("reference") or []
        messages = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers) and isinstance(answers[i], str) and answers[i]:
                messages.append({"role": "assistant", "content": answers[i]})
        return messages
    return None


def _render_chat(messages: list[dict[str, str]], tokenizer: Any, where: str) -> str:
    """A conversation through the tokenizer's chat template, or its texts joined by newlines."""
    if not getattr(tokenizer, "chat_template", None):
        return "\n".join(m["content"] for m in messages)
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as exc:  # a template raises what its author chose (jinja's raise_exception)
        raise SpecbenchError(f"{where}: the tokenizer's chat template refused this conversation "
                             f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
