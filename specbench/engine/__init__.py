"""The speculative decoding engine: the method API, draft trees, verification, the shared loop.

- `Method`, `Prefilled`, `GenerationResult`, `Drafter`, `DraftContext`, `Feedback` (api.py): what
  a decoding method or a drafter fills in.
- `DraftTree` (tree.py): a drafter's proposal; a chain is a tree with one branch.
- `verify`, `verify_greedy`, `verify_sampled` (verifier.py): pure, lossless verification rules.
- `TargetScorer`, `keep_rows` (target.py): one target forward per step, KV cache compaction.
- `Decoder`, `OneRow` (decode.py): the one draft-verify-accept step every decode runs (batch size 1,
  batches through `BatchDecoder` in batch.py, the baseline with an empty draft).
- `SpeculativeMethod` (loop.py): the method every drafter plugs into.
- `Budget`, `BudgetPolicy` (budget.py): hardware-aware draft budgets (`method.budget=auto`).
"""

from specbench.engine.api import DraftContext, Drafter, Feedback, GenerationResult, Method, Prefilled
from specbench.engine.budget import Budget, BudgetPolicy
from specbench.engine.loop import SpeculativeMethod, StepStats
from specbench.engine.target import TargetScorer, keep_rows, probe_tree_attention, tree_attention_inputs
from specbench.engine.tree import AuxBlock, DraftTree, SiblingKind, TreeLayout, layout_of
from specbench.engine.verifier import Verdict, verify, verify_greedy, verify_sampled

__all__ = [
    "AuxBlock", "Budget", "BudgetPolicy",
    "DraftContext", "DraftTree", "Drafter", "Feedback", "GenerationResult", "Method", "Prefilled",
    "SiblingKind", "SpeculativeMethod", "StepStats", "TargetScorer", "TreeLayout", "Verdict", "keep_rows",
    "layout_of", "probe_tree_attention", "tree_attention_inputs", "verify", "verify_greedy", "verify_sampled",
]
