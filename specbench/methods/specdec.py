"""SpecDec (Xia et al. 2023): a non-autoregressive drafter proposes a block of k tokens in one
forward (heads.specdec: a small causal LM plus k - 1 learned mask queries), the target verifies
the block in one forward.

Verification is the shared engine's, exact and lossless, by default. The paper's "top-beta"
tolerance (accept a drafted token when it is among the target's top beta and its logit is
within tau of the best one) trades exactness for longer accepted blocks; it is offered only as
`method=specdec_lossy` (its own name, so its answers and rows are never taken for SpecDec's
lossless ones; the lossless audit reports how its tokens differ from the baseline's), greedy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams, probs_from_logits, sample
from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod
from specbench.engine.api import GenerationResult, Prefilled
from specbench.engine.verifier import Verdict
from specbench.heads.checkpoint import head_folder
from specbench.heads.recipe import HeadData, TrainingBase
from specbench.heads.specdec import MaskQueries, load_mask_queries, read_specdec_config, save_specdec
from specbench.heads.train import train_specdec
from specbench.methods.drafts import check_same_vocabulary, fit_vocab, logits_width, unseen_tokens
from specbench.models import LoadedModel, load_model

LOSSY_LABEL = "top-beta tolerance (lossy)"


@dataclass
class SpecDecSettings:
    """`method=specdec` and `method=specdec_lossy`."""

    head: str | None  # drafter folder (a path or zoo:NAME): a causal LM + specdec.json + mask_queries.safetensors
    block: int | None  # k, tokens drafted per forward (at most the trained block); None = the trained block
    top_beta: int | None  # lossy verification: accept a draft token among the target's top beta (None = exact)
    tau: float  # ... whose logit is within tau of the target's best (with top_beta only)


@dataclass
class SpecDecTraining(TrainingBase):
    """`method.train` of method=specdec (specdec_lossy runs the same drafter): a copy of the model's draft
    fine-tuned with block - 1 mask queries, distilled from the target."""

    starts_from_draft: ClassVar[bool] = True

    block: int = 4  # k: tokens drafted per forward
    batch_rows: int = 8  # windows per step
    window: int = 128  # real tokens per training window
    cuts: int = 24  # cut points per window trained at once (one 4D-masked forward)


class SpecDecDrafter(Drafter):
    """One forward of the drafter per step: the unseen real tokens, then the k - 1 mask queries."""

    def __init__(self, draft: LoadedModel, queries: MaskQueries, block: int, vocab_size: int) -> None:
        self.draft = draft
        self.queries = queries
        self.block = block
        self.vocab_size = vocab_size
        self.cache: Any = None
        self.cached = 0  # real tokens (prompt + generated) in the drafter's cache
        self.sampling = SamplingParams()

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.cache = self.draft.new_cache()
        self.cached = 0
        self.sampling = sampling

    def propose(self, ctx: DraftContext) -> DraftTree:
        k = min(self.block, ctx.max_depth)
        if k <= 0:
            return DraftTree.empty(ctx.device)
        new = unseen_tokens(ctx, self.cached)
        model = self.draft.model
        x = model.get_input_embeddings()(new[None])
        if k > 1:
            x = torch.cat([x, self.queries.embeddings[None, : k - 1].to(x.dtype)], dim=1)
        positions = torch.arange(self.cached, self.cached + x.shape[1], device=ctx.device)[None]
        out = model(inputs_embeds=x, cache=self.cache, use_cache=True, position_ids=positions, logits_to_keep=k)
        self.cached += int(new.shape[0])
        if k > 1:
            self.cache.crop(-(k - 1))  # the mask slots' entries go; the real tokens' stay
        logits = fit_vocab(out.logits[0, -k:], self.vocab_size)
        if self.sampling.greedy:
            return DraftTree.chain(logits.argmax(-1))
        probs = probs_from_logits(logits, self.sampling)
        return DraftTree.chain(sample(probs), probs)  # drawn independently per slot: q_i is what was sampled from


def verify_top_beta(tree: DraftTree, logits: torch.Tensor, beta: int, tau: float) -> Verdict:
    """SpecDec's relaxed greedy verification of a chain (lossy): draft token i is accepted when it is
    among the target's top `beta` at its position and its logit is at most `tau` below the best;
    the longest accepted prefix is kept and the target's argmax follows it."""
    n = tree.n
    best = logits.argmax(-1)
    if n == 0:
        return Verdict([], [], int(best[0]))
    scores = logits[:n].float()
    tokens = tree.tokens.to(logits.device)
    mine = scores.gather(1, tokens[:, None])[:, 0]
    rank = (scores > mine[:, None]).sum(1)  # how many logits beat the drafted token's
    ok = (rank < beta) & (scores.max(1).values - mine <= tau)
    m = int(ok.to(torch.long).cumprod(0).sum())
    return Verdict(list(range(m)), tokens[:m].tolist(), int(best[m]))


class SpecDec(SpeculativeMethod):
    """`method=specdec`: the drafter of `method.head` (default the zoo's, for model=tiny)."""

    Settings = SpecDecSettings
    Training = SpecDecTraining

    @classmethod
    def train_head(cls, data: HeadData, settings: SpecDecTraining, out: Path) -> dict:
        """The NAR drafter: the model's draft plus block - 1 mask queries, distilled from the frozen target's
        next-token distributions; saved as a causal LM folder with specdec.json and the queries."""
        features = data.features(settings.tokens)
        lm_head = data.target.get_output_embeddings()
        draft, queries, stats = train_specdec(features, data.the_draft("specdec"), lm_head, block=settings.block,
                                              steps=data.steps(settings), batch_rows=settings.batch_rows,
                                              window=settings.window, cuts=settings.cuts, lr=settings.lr,
                                              seed=data.seed_of(settings), compute_dtype=data.compute(settings),
                                              ckpt=data.ckpt, desc=data.desc("specdec"))
        save_specdec(draft, queries, data.tokenizer, out, int(lm_head.weight.shape[0]), data.base)
        return {"tokens": features.n_tokens, "params": sum(p.numel() for p in draft.parameters())
                + queries.embeddings.numel(), "block": queries.block, **stats.as_dict()}

    def build_drafter(self) -> Drafter:
        s = self.settings
        self.lossy = s.top_beta is not None
        if self.lossy and "lossy" not in str(self.cfg.name):
            raise SpecbenchError("method.top_beta makes SpecDec's verification lossy; run method=specdec_lossy "
                                 "(its answers are labelled lossy) instead of setting top_beta on method=specdec")
        if self.lossy and (s.top_beta < 1 or not s.tau >= 0):
            raise SpecbenchError(f"specdec_lossy needs top_beta >= 1 and tau >= 0, got top_beta={s.top_beta}, "
                                 f"tau={s.tau}")
        folder = head_folder(s.head, self.model_cfg, "specdec", "SpecDec")
        vocab = logits_width(self.target)
        config = read_specdec_config(folder, vocab)
        block = s.block or config["block"]
        if not 1 <= block <= config["block"]:
            raise SpecbenchError(f"method.block={block}: the drafter in {folder} was trained for blocks of up to "
                                 f"{config['block']} tokens; give 1..{config['block']} or null")
        draft = load_model(str(folder), device=self.target.device, dtype=self.target.dtype,
                           trust_remote_code=bool(self.model_cfg.get("trust_remote_code", False)))
        check_same_vocabulary(self.target, draft, str(folder))
        hidden = int(draft.model.get_input_embeddings().weight.shape[1])
        queries = load_mask_queries(folder, config, hidden, self.target.device, self.target.dtype)
        return SpecDecDrafter(draft, queries, block, vocab)

    def verify_step(self, tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams) -> Verdict:
        if not self.lossy:
            return super().verify_step(tree, logits, sampling)
        if not sampling.greedy:
            raise SpecbenchError("method=specdec_lossy's top-beta verification is defined for greedy decoding; run it "
                                 "with temperature=0, or use method=specdec (exact) under sampling")
        return verify_top_beta(tree, logits, int(self.settings.top_beta), float(self.settings.tau))

    def annotate(self, result: GenerationResult) -> GenerationResult:
        if self.lossy:
            lossy = f"{LOSSY_LABEL}: beta={self.settings.top_beta}, tau={self.settings.tau}"
            result.stats.counters["verification"] = lossy
        return result

    def extra_parameters(self) -> int:
        d = self.drafter
        return sum(p.numel() for p in d.draft.model.parameters()) + d.queries.embeddings.numel()
