"""A kit's corpus: the target's own kind of text, made in resumable shards.

Drafts and heads learn what the target says. So the target writes its own corpus: the user turns
(Magpie-style: the chat template's user prefix, the target continues it, sometimes after an
opening word), and the answers, greedy or sampled. Around those, prompts of the benchmark's six
shapes are built from what it wrote, with long inputs where the subtask has them:

- `instruct`: a user turn the target writes from the template's user prefix alone;
- `hinted`: the same, started with an opening word (questions, tasks, code, advice, role-play);
- `math`: multi-step arithmetic word problems (templates here, random numbers);
- `foreign`: "write a few sentences in German / French / Spanish about ..." (the source text of
  `translate`);
- `summarize`: one or two long answers of the first pass as the document to summarise;
- `rag`: a question of the first pass with its answer and other answers as numbered passages;
- `translate`: a `foreign` answer's first sentences, to translate into English;
- `second`: a follow-up user turn the target writes after a first exchange, answered with that
  exchange in the prompt (the multi-turn subtask's second turn).

No prompt comes from a benchmark question (a test checks the committed shards against the official
question file where it is present). Every row keeps the target's top-k log-probabilities at each
answer position (`topk`), computed while it generated, so distillation never runs the target again.

Shard i is made from the settings, i and the target alone (seeded), in one piece: its rows
(`shard-NNNNN.jsonl.gz`), its top-k (`shard-NNNNN.topk.safetensors`) and last its card
(`shard-NNNNN.json`, the mark of a finished shard). An interrupted build keeps every finished shard
and resumes at the first missing one; more shards extend a corpus without remaking it. A shard
is looked up in the cache, then in the repository's committed copy (`weights/kits/...`: the
rows and cards, not the top-k, which a teacher-forced pass recomputes once per machine).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import platform
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.files import write_atomic
from specbench.kit.generate import Generated, Sampling, generate
from specbench.synth.seeds import derive_seed, seeded_rng

#: Bump when a change here changes what a shard holds.
CORPUS_CODE_VERSION = "corpus-2"
KINDS = ("instruct", "hinted", "math", "foreign", "summarize", "rag", "translate", "second")
FIRST_PASS = ("instruct", "hinted", "math", "foreign")
MARK = "\u2063SPECBENCH-TURN\u2063"  # stands for a turn's text while the template is rendered

#: opening words of `hinted` user turns (the target writes the rest)
OPENERS = (
    "Write", "Explain", "How do I", "What is", "Who was", "When did", "Where is", "Why do", "Can you help me",
    "Give me", "Compare", "Describe", "Imagine you are", "Solve", "Write a Python function", "List",
    "What are the benefits of", "I need advice on", "Tell me about", "Create a", "Rewrite the following",
    "Classify", "How many", "Summarize", "Translate", "Is it true that", "Suggest", "Draft an email",
    "What would happen if", "Help me plan",
)
#: subjects of the `foreign` texts
SUBJECTS = (
    "the weather in spring", "a family dinner", "a train journey", "a visit to the doctor", "the local market",
    "a football match", "learning to cook", "a new job", "the history of a small town", "a birthday party",
    "climate change", "a museum visit", "working from home", "a mountain hike", "the school year",
    "a rainy day in the city", "electric cars", "a summer holiday by the sea", "the price of bread",
    "a concert", "a lost cat", "the first day at university", "a library", "renewable energy", "a wedding",
    "a bicycle repair", "the news of the day", "a garden in autumn", "a hospital", "an election",
    "a new smartphone", "a trip to the capital", "a bakery", "winter sports", "a science experiment",
    "a flood", "a friendship", "the tax office", "an old castle", "a restaurant review",
)
LANGUAGES = ("German", "German", "French", "Spanish")  # German twice: the benchmark translates from German
NAMES = ("Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kemal", "Lena",
         "Marco", "Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Samir", "Tara")
ITEMS = ("apple", "pencil", "notebook", "cookie", "marble", "sticker", "book", "ticket", "candle", "plant")


# ---------------------------------------------------------------------------------------------
# the settings and where shards live


@dataclass(frozen=True)
class CorpusSettings:
    """`build.corpus` of a kit: how many shards, and what one shard holds."""

    shards: int
    seed: int
    per_shard: dict[str, int]
    max_new_tokens: int
    turn_tokens: int
    sampled: float
    temperatures: tuple[float, ...]
    top_p: float
    topk: int
    batch_size: int
    dtype: str

    @classmethod
    def of(cls, section: Any) -> CorpusSettings:
        from omegaconf import OmegaConf

        raw = OmegaConf.to_container(section, resolve=True) if not isinstance(section, dict) else dict(section)
        per_shard = {k: int(v) for k, v in (raw.get("per_shard") or {}).items()}
        unknown = sorted(set(per_shard) - set(KINDS))
        if unknown:
            raise SpecbenchError(f"build.corpus.per_shard has unknown kind(s) {', '.join(unknown)}; "
                                 f"use {', '.join(KINDS)}")
        return cls(shards=int(raw["shards"]), seed=int(raw["seed"]), per_shard=per_shard,
                   max_new_tokens=int(raw["max_new_tokens"]), turn_tokens=int(raw["turn_tokens"]),
                   sampled=float(raw["sampled"]), temperatures=tuple(float(t) for t in raw["temperatures"]),
                   top_p=float(raw["top_p"]), topk=int(raw["topk"]), batch_size=int(raw["batch_size"]),
                   dtype=str(raw.get("dtype", "auto")))

    def shard_key(self, target: str) -> str:
        """8 hex digits naming what one shard is made from (not how many shards there are)."""
        fields = {k: v for k, v in self.__dict__.items() if k not in ("shards", "batch_size", "dtype")}
        text = json.dumps({"code": CORPUS_CODE_VERSION, "target": target, **fields}, sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:8]


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


@dataclass(frozen=True)
class ShardPlace:
    """Where shard files are: `cache` (built or topk-completed here) and `committed` (the repository's)."""

    cache: Path
    committed: Path | None

    def card(self, index: int) -> Path | None:
        """The card of a finished shard `index`: the cache's first, then the committed one."""
        for folder in (self.cache, self.committed):
            if folder is not None and (folder / f"{shard_name(index)}.json").is_file():
                return folder / f"{shard_name(index)}.json"
        return None

    def rows_file(self, index: int) -> Path:
        card = self.card(index)
        if card is None:
            raise SpecbenchError(f"corpus shard {index} is not built; run `python -m specbench kit build ...`")
        return card.with_name(f"{shard_name(index)}.jsonl.gz")

    def topk_file(self, index: int) -> Path:
        return self.cache / f"{shard_name(index)}.topk.safetensors"


# ---------------------------------------------------------------------------------------------
# prompts


def template_prefixes(tokenizer: Any) -> tuple[str, Callable[[str, str], str]]:
    """The rendered text before a first user turn, and a function giving the text before the
    second user turn after (turn, answer): where the target starts writing a user turn."""
    first = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False)
    if MARK not in first:
        raise SpecbenchError("the chat template does not render a user turn as given; the corpus needs it")
    head = first.split(MARK)[0]

    def after(turn: str, answer: str) -> str:
        text = tokenizer.apply_chat_template([{"role": "user", "content": turn},
                                              {"role": "assistant", "content": answer},
                                              {"role": "user", "content": MARK}], tokenize=False)
        return text.split(MARK)[0]

    return head, after


def math_problem(rng: Any) -> str:
    """A multi-step arithmetic word problem with whole-number steps."""
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    kind = rng.randrange(8)
    if kind == 0:
        packs, each, given = rng.randint(2, 9), rng.randint(3, 12), rng.randint(1, 10)
        return (f"{name} buys {packs} packs of {item}s with {each} {item}s in each pack, then gives {given} of "
                f"them to {other}. How many {item}s does {name} have left?")
    if kind == 1:
        price, monday, more = rng.randint(2, 15), rng.randint(10, 60), rng.randint(2, 20)
        return (f"A shop sells {item}s for ${price} each. It sells {monday} on Monday and {more} more on Tuesday "
                f"than on Monday. How much money does the shop take in on the two days?")
    if kind == 2:
        a, d, b, e = rng.randint(5, 30), rng.randint(2, 7), rng.randint(5, 30), rng.randint(2, 7)
        total = a * d + b * e + rng.randint(10, 200)
        return (f"{name} reads {a} pages a day for {d} days, then {b} pages a day for {e} days. The book has "
                f"{total} pages. How many pages are left to read?")
    if kind == 3:
        v, h, w, k = rng.randint(40, 120), rng.randint(1, 5), rng.randint(40, 120), rng.randint(1, 5)
        return (f"A train travels at {v} km per hour for {h} hours and then at {w} km per hour for {k} hours. "
                f"How far does it travel in total?")
    if kind == 4:
        third = rng.randint(5, 40)
        return (f"{name} has ${third * 3}. {name} spends a third of it on lunch and then half of what is left "
                f"on a {item}. How much money does {name} have now?")
    if kind == 5:
        rows, per, dead, bundle = rng.randint(3, 12), rng.randint(5, 20), rng.randint(1, 9), rng.randint(2, 6)
        alive = rows * per - dead
        dead += alive % bundle
        return (f"A farmer plants {rows} rows of tomatoes with {per} plants in each row. {dead} plants die. "
                f"The farmer sells the rest in bundles of {bundle}. How many bundles does the farmer sell?")
    if kind == 6:
        price, pct, n = rng.randint(2, 20) * 10, rng.choice((10, 20, 25, 50)), rng.randint(2, 6)
        return (f"A {item} costs ${price}. It is on sale for {pct}% off. {name} buys {n} of them. How much does "
                f"{name} pay?")
    age, older, later = rng.randint(5, 40), rng.randint(2, 15), rng.randint(2, 10)
    return (f"{name} is {age} years old and {other} is {older} years older. In {later} years, what will the sum "
            f"of their ages be?")


def foreign_prompt(rng: Any) -> tuple[str, str]:
    language = rng.choice(LANGUAGES)
    subject = rng.choice(SUBJECTS)
    form = rng.randrange(3)
    if form == 0:
        return language, f"Write a short paragraph in {language} about {subject}."
    if form == 1:
        return language, f"Write three sentences in {language} about {subject}. Answer only in {language}."
    return language, f"In {language}, describe {subject} in a few sentences."


ENGLISH = frozenset("the and is of to in a that it for are with this was as on be by you".split())


def looks_english(text: str) -> bool:
    """Whether a text reads as English (a fifth or more of its words are common English words):
    a `foreign` answer that does is no source text for `translate`."""
    words = re.findall(r"[a-zA-Z\u00c0-\u024f]+", text.lower())
    return not words or sum(w in ENGLISH for w in words) >= 0.2 * len(words)


def _sentences(text: str, most: int) -> str:
    parts = re.split(r"(?<=[.!?])\s+", text.strip())
    return " ".join(parts[:most]).strip()


def _words(text: str, most: int) -> str:
    words = text.split()
    return " ".join(words[:most]) + ("..." if len(words) > most else "")


def summarize_prompt(rng: Any, document: str) -> str:
    form = rng.randrange(4)
    if form == 0:
        return f"Summarize the following article in a few sentences:\n\n{document}"
    if form == 1:
        return f"{document}\n\nWrite a short summary of the text above."
    if form == 2:
        return f"Give a brief summary of this document.\n\n{document}"
    return f"Summarize: {document}"


def rag_prompt(rng: Any, question: str, passages: Sequence[str]) -> str:
    if rng.randrange(2):
        body = "\n\n".join(f"Passage {i + 1}: {p}" for i, p in enumerate(passages))
        return f"Use the passages below to answer the question.\n\n{body}\n\nQuestion: {question}"
    body = "\n".join(f"[{i + 1}] {p}" for i, p in enumerate(passages))
    return f"Answer the question based on the documents.\n\nDocuments:\n{body}\n\nQuestion: {question}\nAnswer:"


def translate_prompt(rng: Any, language: str, text: str) -> str:
    form = rng.randrange(3)
    if form == 0:
        return f"Translate the following {language} text into English:\n\n{text}"
    if form == 1:
        return f"Translate {language} to English: {text}"
    return f"{text}\n\nTranslate this into English."


# ---------------------------------------------------------------------------------------------
# one shard


@dataclass
class Row:
    kind: str
    turns: list[str]
    context: list[str]  # the answers to the earlier turns (rendered into the prompt as text)
    temperature: float
    prompt_ids: list[int]
    answer_ids: list[int]
    ended: bool
    extra: dict

    def as_json(self) -> dict:
        return {"kind": self.kind, "turns": self.turns, "context": self.context, "temperature": self.temperature,
                "prompt_ids": self.prompt_ids, "answer_ids": self.answer_ids, "ended": self.ended, **self.extra}


class ShardMaker:
    """Makes shard `index` with a loaded target (`model`, `tokenizer`, end ids)."""

    def __init__(self, settings: CorpusSettings, model: torch.nn.Module, tokenizer: Any, end_ids: set[int],
                 progress: Callable[[str], None] | None = None) -> None:
        self.s, self.model, self.tok, self.end_ids = settings, model, tokenizer, end_ids
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(end_ids)
        self.progress = progress
        self.head, self.after = template_prefixes(tokenizer)

    def _prompt(self, turns: list[str], context: list[str]) -> list[int]:
        from specbench.core.prompts import prompt_ids

        return prompt_ids("chat_template", self.tok, turns, context)

    def _mode(self, rng: Any) -> Sampling:
        if rng.random() < self.s.sampled:
            return Sampling(rng.choice(self.s.temperatures), self.s.top_p)
        return Sampling()

    def user_turns(self, prefixes: list[str], openers: list[str], seed: int, desc: str) -> list[str | None]:
        """The target writes a user turn after each prefix (+ opener); None where the turn did not
        end, is too short, or repeats one already kept."""
        ids = [self.tok(p + o, add_special_tokens=False).input_ids for p, o in zip(prefixes, openers, strict=True)]
        made = generate(self.model, ids, [Sampling(1.0, self.s.top_p)] * len(ids),
                        max_new_tokens=self.s.turn_tokens, end_ids=self.end_ids, pad_id=self.pad, topk=0,
                        seed=seed, batch_size=self.s.batch_size, desc=desc, progress=self.progress)
        out: list[str | None] = []
        seen: set[str] = set()
        for opener, res in zip(openers, made, strict=True):
            text = (opener + self.tok.decode(res.ids, skip_special_tokens=True)).strip()
            key = " ".join(text.lower().split())
            ok = res.ended and len(text.split()) >= 3 and key not in seen and MARK not in text
            if ok:
                seen.add(key)
            out.append(text if ok else None)
        return out

    def answer(self, rows: list[Row], seed: int, desc: str) -> list[tuple[Row, Generated]]:
        made = generate(self.model, [r.prompt_ids for r in rows],
                        [Sampling(r.temperature, self.s.top_p if r.temperature > 0 else 1.0) for r in rows],
                        max_new_tokens=self.s.max_new_tokens, end_ids=self.end_ids, pad_id=self.pad,
                        topk=self.s.topk, seed=seed, batch_size=self.s.batch_size, desc=desc,
                        progress=self.progress)
        for row, res in zip(rows, made, strict=True):
            row.answer_ids, row.ended = res.ids, res.ended
        return list(zip(rows, made, strict=True))

    def _row(self, rng: Any, kind: str, turns: list[str], context: list[str], **extra: Any) -> Row:
        return Row(kind, turns, context, self._mode(rng).temperature, self._prompt(turns, context), [], False,
                   extra)

    def make(self, index: int) -> tuple[list[Row], list[Generated]]:
        s = self.s
        rng = seeded_rng("kit-corpus", s.seed, index)
        seed = derive_seed("kit-corpus-torch", s.seed, index) % (2**31)
        want = s.per_shard
        # pass 1: user turns (half again as many tried as kept: some do not end or repeat)
        n_plain, n_hinted = want.get("instruct", 0), want.get("hinted", 0)
        tries = [""] * (n_plain + n_plain // 2 + 1)
        tries += [rng.choice(OPENERS) for _ in range(n_hinted + n_hinted // 2 + 1)]
        written = self.user_turns([self.head] * len(tries), tries, seed, f"shard {index} user turns")
        plain = [t for t, o in zip(written, tries, strict=True) if t and not o][:n_plain]
        hinted = [t for t, o in zip(written, tries, strict=True) if t and o][:n_hinted]
        first = [self._row(rng, "instruct", [t], []) for t in plain]
        first += [self._row(rng, "hinted", [t], []) for t in hinted]
        first += [self._row(rng, "math", [math_problem(rng)], []) for _ in range(want.get("math", 0))]
        for _ in range(want.get("foreign", 0)):
            language, text = foreign_prompt(rng)
            first.append(self._row(rng, "foreign", [text], [], language=language))
        done = self.answer(first, seed + 1, f"shard {index} first answers")
        # pass 2: prompts built on the first answers
        texts = [self.tok.decode(r.answer_ids, skip_special_tokens=True).strip() for r in first]
        second: list[Row] = []
        long_docs = [t for r, t in zip(first, texts, strict=True)
                     if r.kind in ("instruct", "hinted") and len(r.answer_ids) >= 150 and r.ended]
        for _ in range(want.get("summarize", 0)):
            if not long_docs:
                break
            picked = rng.sample(long_docs, min(len(long_docs), rng.choice((1, 1, 2))))
            second.append(self._row(rng, "summarize", [summarize_prompt(rng, "\n\n".join(picked))], []))
        asked = [(r.turns[0], t) for r, t in zip(first, texts, strict=True)
                 if r.kind in ("instruct", "hinted") and r.turns[0].rstrip().endswith("?") and r.ended and t]
        pool = [t for r, t in zip(first, texts, strict=True) if r.kind in ("instruct", "hinted") and r.ended and t]
        for _ in range(want.get("rag", 0)):
            if not asked:
                break
            question, answer = rng.choice(asked)
            rest = [p for p in pool if p != answer]
            if len(rest) < 2:
                continue
            others = rng.sample(rest, min(len(rest), rng.randint(2, 4)))
            passages = [_words(p, 120) for p in [answer, *others]]
            rng.shuffle(passages)
            second.append(self._row(rng, "rag", [rag_prompt(rng, question, passages)], []))
        foreign = [(r.extra["language"], t) for r, t in zip(first, texts, strict=True)
                   if r.kind == "foreign" and r.ended and not looks_english(t)]
        for _ in range(want.get("translate", 0)):
            if not foreign:
                break
            language, text = rng.choice(foreign)
            source = _sentences(text, rng.randint(1, 3))
            second.append(self._row(rng, "translate", [translate_prompt(rng, language, source)], [], language=language))
        exchanges = [(r.turns[0], t) for r, t in zip(first, texts, strict=True)
                     if r.kind in ("instruct", "hinted", "math") and r.ended and t]
        n_second = want.get("second", 0)
        if n_second and exchanges:
            chosen = [rng.choice(exchanges) for _ in range(n_second + n_second // 2 + 1)]
            follow = self.user_turns([self.after(q, a) for q, a in chosen], [""] * len(chosen), seed + 2,
                                     f"shard {index} second turns")
            kept = [(q, a, f) for (q, a), f in zip(chosen, follow, strict=True) if f][:n_second]
            second += [self._row(rng, "second", [q, f], [a]) for q, a, f in kept]
        done += self.answer(second, seed + 3, f"shard {index} second answers")
        return [r for r, _ in done], [g for _, g in done]


# ---------------------------------------------------------------------------------------------
# shard files


def write_rows(path: Path, rows: Sequence[Row]) -> None:
    """Rows as gzip'd JSON lines, byte-stable (no timestamp in the gzip header)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz:
        for row in rows:
            gz.write((json.dumps(row.as_json(), ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


def read_rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_topk(path: Path, made: Sequence[Generated]) -> None:
    ids = torch.cat([g.topk_ids for g in made]) if made else torch.empty(0, 0, dtype=torch.int32)
    logp = torch.cat([g.topk_logp for g in made]) if made else torch.empty(0, 0, dtype=torch.float16)
    save_topk(path, ids, logp)


def save_topk(path: Path, ids: torch.Tensor, logp: torch.Tensor) -> None:
    """A shard's top-k file (every answer position of its rows, in order), written whole, then renamed."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file({"ids": ids.contiguous(), "logp": logp.contiguous()}, str(tmp))
    tmp.replace(path)


def machine() -> dict:
    from specbench.core.hardware import cpu_info

    return {"cpu": cpu_info().get("model"), "bf16_units": torch.cpu._is_avx512_bf16_supported(),
            "python": platform.python_version(), "torch": torch.__version__}


def build_shard(maker: ShardMaker, place: ShardPlace, index: int, dtype: torch.dtype) -> dict:
    """Make shard `index` into the cache (rows, top-k, then the card): the card's content."""
    import transformers

    start = time.perf_counter()
    rows, made = maker.make(index)
    place.cache.mkdir(parents=True, exist_ok=True)
    name = shard_name(index)
    write_rows(place.cache / f"{name}.jsonl.gz", rows)
    write_topk(place.topk_file(index), made)
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    card = {"shard": index, "rows": len(rows), "kinds": kinds,
            "answer_tokens": sum(len(r.answer_ids) for r in rows),
            "prompt_tokens": sum(len(r.prompt_ids) for r in rows),
            "ended": sum(r.ended for r in rows), "sampled": sum(r.temperature > 0 for r in rows),
            "topk": maker.s.topk, "dtype": str(dtype).removeprefix("torch."),
            "seconds": round(time.perf_counter() - start, 1), "machine": machine(),
            "transformers": transformers.__version__, "code": CORPUS_CODE_VERSION,
            "built": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_atomic(place.cache / f"{name}.json", json.dumps(card, indent=2) + "\n")  # last: the shard is finished
    return card


def missing(place: ShardPlace, shards: int) -> list[int]:
    return [i for i in range(shards) if place.card(i) is None]


def iter_rows(place: ShardPlace, shards: int) -> Iterator[tuple[int, int, dict]]:
    """(shard, row index in it, row) over every row of the first `shards` shards."""
    for i in range(shards):
        for j, row in enumerate(read_rows(place.rows_file(i))):
            yield i, j, row


def heldout(shard: int, row: int, fraction: float) -> bool:
    """Whether a row is held out (never trained on): a stable draw per row, so adding shards keeps
    every earlier row on its side."""
    return derive_seed("kit-corpus-heldout", shard, row) % 10_000 < fraction * 10_000


@torch.inference_mode()
def teacher_topk(model: torch.nn.Module, rows: Sequence[dict], k: int, batch: int = 8) -> list[Generated]:
    """The target's top-k at every answer position of finished rows, by one forward per batch
    (right-padded): what generation would have kept, for shards made on another machine."""
    out: list[Generated] = []
    for lo in range(0, len(rows), batch):
        part = rows[lo:lo + batch]
        seqs = [r["prompt_ids"] + r["answer_ids"] for r in part]
        width = max(map(len, seqs))
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, seq in enumerate(seqs):
            ids[r, :len(seq)] = torch.tensor(seq)
            mask[r, :len(seq)] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits
        for r, row in enumerate(part):
            p, a = len(row["prompt_ids"]), len(row["answer_ids"])
            logp = torch.log_softmax(logits[r, p - 1:p + a - 1].float(), -1)
            top = logp.topk(k, -1)
            out.append(Generated(row["answer_ids"], bool(row.get("ended")), top.indices.to(torch.int32),
                                 top.values.to(torch.float16)))
    return out


def ensure_topk(place: ShardPlace, index: int, model_loader: Callable[[], torch.nn.Module], k: int) -> Path:
    """The shard's top-k file, recomputed from its rows by the target when the shard came from
    elsewhere (once per machine, cached beside the cache's shards)."""
    path = place.topk_file(index)
    if path.is_file():
        return path
    rows = read_rows(place.rows_file(index))
    place.cache.mkdir(parents=True, exist_ok=True)
    write_topk(path, teacher_topk(model_loader(), rows, k))
    return path


def read_topk(place: ShardPlace, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = load_file(str(place.topk_file(index)))
    return tensors["ids"], tensors["logp"]


def copy_shards(place: ShardPlace, shards: int, into: Path) -> list[str]:
    """Copy the finished shards' rows and cards (not their top-k) into `into` (the committed copy)."""
    into.mkdir(parents=True, exist_ok=True)
    copied = []
    for i in range(shards):
        card = place.card(i)
        if card is None or card.parent == into:
            continue
        for suffix in (".jsonl.gz", ".json"):  # the card last
            src = card.with_name(shard_name(i) + suffix)
            shutil.copyfile(src, into / src.name)
        copied.append(shard_name(i))
    return copied
