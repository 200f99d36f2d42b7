"""Verification: which path of a draft tree the target accepts, and the token after it.

Pure functions on tensors, so tests can call them with hand-made distributions. All of
them are lossless: the emitted tokens are distributed exactly as the target's own samples
(greedy: exactly the target's argmax continuation).

Rows: `logits` / `target_probs` have n + 1 rows, row 0 for the root (it gives the
distribution of the root's children) and row i + 1 for node i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.core.sampling import SamplingParams, probs_from_logits, sample
from specbench.engine.tree import DraftTree


@dataclass
class Verdict:
    """path: accepted node indices from the root down; tokens: their ids; token: the
    target's own next token after the path (the bonus token, or the correction)."""

    path: list[int]
    tokens: list[int]
    token: int

    @property
    def rows(self) -> list[int]:
        """Block rows to keep in the KV cache: the root and the accepted nodes."""
        return [0, *(i + 1 for i in self.path)]


def verify(tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams) -> Verdict:
    """Greedy match when greedy, else speculative sampling with the baseline's logits processing."""
    if sampling.greedy:
        return verify_greedy(tree, logits)
    return verify_sampled(tree, probs_from_logits(logits, sampling))


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    """The deepest node whose whole path matches the target's argmax, then the argmax after it.

    One device-to-host transfer per call; ties between equally deep valid nodes (duplicate
    siblings) go to the lowest index, which emits the same tokens.
    """
    best = logits.argmax(-1)  # (n + 1,)
    n = tree.n
    if n == 0:
        return Verdict([], [], int(best[0]))
    layout = tree.layout
    device = logits.device
    tokens = tree.tokens.to(device)
    if layout.is_chain:
        ok = tokens == best[:-1]
        m = ok.to(torch.long).cumprod(0).sum()
        host = torch.cat([m.view(1), best[m].view(1), tokens]).tolist()
        m_ = host[0]
        return Verdict(list(range(m_)), host[2 : 2 + m_], host[1])
    ok = tokens == best[layout.on("parent_rows", device)]
    bad = (~ok).float()
    valid = layout.on("node_ancestors", device) @ bad == 0  # every node on the path matches
    score = torch.where(valid, layout.on("depth", device), torch.zeros_like(tokens))
    node = score.argmax()  # first of the deepest valid nodes; score 0 = nothing valid
    row = torch.where(score[node] > 0, node + 1, torch.zeros_like(node))
    host = torch.cat([row.view(1), best[row].view(1), tokens]).tolist()
    if host[0] == 0:
        return Verdict([], [], host[1])
    path = list(layout.paths[host[0] - 1])
    return Verdict(path, [host[2 + i] for i in path], host[1])


def _residual(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """norm(max(0, q - p)); q itself when that is all zero (only rounding or a drafter whose
    p is not the distribution its token came from can get here)."""
    res = (q - p).clamp_min(0)
    total = res.sum(-1, keepdim=True)
    return torch.where(total > 0, res / total.clamp_min(torch.finfo(res.dtype).tiny), q)


def verify_sampled(tree: DraftTree, target_probs: torch.Tensor) -> Verdict:
    """Speculative sampling: the chain rule for chains, multi-branch rejection for trees."""
    if tree.n == 0:
        return Verdict([], [], int(sample(target_probs[0])))
    if tree.layout.is_chain:
        return _verify_chain_sampled(tree, target_probs)
    return _verify_tree_sampled(tree, target_probs)


def _verify_chain_sampled(tree: DraftTree, q: torch.Tensor) -> Verdict:
    """Accept node i with prob min(1, q_i(x) / p_i(x)) while they are accepted; at the first
    rejection sample from norm(max(0, q_i - p_i)), after a full acceptance from q_n.

    Vectorised: one uniform per node, one device-to-host transfer. Without draft
    probabilities p is one-hot on the candidate (accept with q(x), else q without x).
    """
    n = tree.n
    device = q.device
    x = tree.tokens.to(device)
    qx = q[:-1].gather(1, x[:, None]).squeeze(1)
    p = tree.draft_probs if tree.kind != "deterministic" else None
    if p is None:
        px = torch.ones_like(qx)
    else:
        p = p.to(device=device, dtype=q.dtype)
        px = p.gather(1, x[:, None]).squeeze(1)
    # u < q/p without dividing: exact for p = 0, and q(x) = 0 is never accepted.
    accepted = torch.rand(n, device=device, dtype=q.dtype) * px < qx
    m = accepted.to(torch.long).cumprod(0).sum()
    at = m.clamp(max=n - 1)  # the rejected node (unused when all were accepted)
    if p is None:
        p_at = torch.nn.functional.one_hot(x[at], q.shape[-1]).to(q.dtype)
    else:
        p_at = p[at]
    dist = torch.where(m < n, _residual(q[at], p_at), q[n])
    token = sample(dist)
    host = torch.cat([m.view(1), token.view(1), x]).tolist()
    m_ = host[0]
    return Verdict(list(range(m_)), host[2 : 2 + m_], host[1])


def _verify_tree_sampled(tree: DraftTree, q_all: torch.Tensor) -> Verdict:
    """Multi-branch rejection sampling down the tree (SpecInfer; Jeon et al. 2024 for siblings
    drawn without replacement).

    At a row with target distribution q, try its children in order: accept child x with
    prob min(1, q(x) / p(x)); after a rejection q <- norm(max(0, q - p)) (p one-hot on x for
    deterministic candidates), and without replacement also p <- p with x removed,
    renormalised. Accepting moves down to that child; when every child is rejected, or a
    leaf was accepted, the next token is sampled from the current q.
    """
    layout = tree.layout
    device = q_all.device
    x_all = tree.tokens.tolist()
    probs = tree.draft_probs if tree.kind != "deterministic" else None
    if probs is not None:
        probs = probs.to(device=device, dtype=q_all.dtype)
    uniforms = torch.rand(tree.n, dtype=torch.float64).tolist()  # one per node: each is tried once at most
    path: list[int] = []
    row = 0
    while True:
        q = q_all[row]
        kids = layout.children[row]
        if not kids:
            break
        # Siblings share the distribution they were drawn from: the first child's row.
        p = None if probs is None else probs[kids[0]]
        chosen = None
        for child in kids:
            x = x_all[child]
            qx = float(q[x])
            px = 1.0 if p is None else float(p[x])
            if uniforms[child] * px < qx:
                chosen = child
                break
            if p is None:
                q = _residual(q, torch.nn.functional.one_hot(torch.tensor(x, device=device), q.shape[-1]).to(q.dtype))
            else:
                q = _residual(q, p)
                if tree.kind == "without_replacement":
                    p = p.clone()
                    p[x] = 0
                    total = p.sum()
                    p = p / total if float(total) > 0 else p
        if chosen is None:
            break
        path.append(chosen)
        row = chosen + 1
    return Verdict(path, [x_all[i] for i in path], int(sample(q)))
