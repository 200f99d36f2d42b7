"""The speculative decoding engine: draft trees, verification, the shared decode loop.

- `DraftTree` (tree.py): a drafter's proposal; a chain is a tree with one branch.
- `verify`, `verify_greedy`, `verify_sampled` (verifier.py): pure, lossless verification rules.
- `TargetScorer`, `keep_rows` (target.py): one target forward per step, KV cache compaction.
- `Drafter`, `DraftContext`, `Feedback`, `SpeculativeMethod` (loop.py): the loop methods share.
"""

from specbench.engine.loop import DraftContext, Drafter, Feedback, SpeculativeMethod, StepStats
from specbench.engine.target import TargetScorer, keep_rows, probe_tree_attention, tree_attention_inputs
from specbench.engine.tree import AuxBlock, DraftTree, SiblingKind, TreeLayout, layout_of
from specbench.engine.verifier import Verdict, verify, verify_greedy, verify_sampled

__all__ = [
    "AuxBlock", "DraftContext", "DraftTree", "Drafter", "Feedback", "SiblingKind", "SpeculativeMethod",
    "StepStats", "TargetScorer", "TreeLayout", "Verdict", "keep_rows", "layout_of", "probe_tree_attention",
    "tree_attention_inputs", "verify", "verify_greedy", "verify_sampled",
]
