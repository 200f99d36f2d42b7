"""Drafts trained on a kit's corpus (specbench.kit.distill): the top-k KL, batches that use every
row once an epoch, held-out chain acceptance computed exactly, a draft started from the target's
own blocks, and training that lowers the held-out loss."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from specbench.core.errors import SpecbenchError
from specbench.kit import distill
from specbench.models import load_model

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("one_thread")]


def test_the_topk_kl_is_the_full_kl_when_k_is_the_vocabulary_and_never_negative():
    torch.manual_seed(0)
    student, teacher = torch.randn(6, 11), torch.randn(6, 11)
    t_logp = torch.log_softmax(teacher, -1)
    full = (t_logp.exp() * (t_logp - torch.log_softmax(student, -1))).sum(-1)
    top = t_logp.topk(11, -1)
    assert torch.allclose(distill.kd_topk(student, top.indices, top.values), full, atol=1e-4)
    small = t_logp.topk(3, -1)
    assert (distill.kd_topk(student, small.indices, small.values) >= -1e-6).all()
    assert distill.kd_topk(teacher, small.indices, small.values).abs().max() < 1e-4  # the teacher itself: 0


def test_an_epoch_batches_every_row_once_within_the_token_budget():
    lengths = [5, 300, 40, 41, 39, 200, 7, 120, 90, 10] * 7
    for epoch in range(2):
        plan = distill.batches(lengths, 400, seed=1, epoch=epoch)
        assert sorted(i for b in plan for i in b) == list(range(len(lengths)))
        assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 400 for b in plan)
    assert distill.batches(lengths, 400, 1, 0) != distill.batches(lengths, 400, 1, 1)


class Copycat(torch.nn.Module):
    """A 'draft' whose greedy token at each position is a fixed table's: lets a test set which
    positions match the target."""

    def __init__(self, vocab: int, next_of: dict[int, int]):
        super().__init__()
        self.vocab, self.next_of = vocab, next_of

    def get_decoder(self):
        parent = self

        class Decoder(torch.nn.Module):
            def forward(self, input_ids):
                out = torch.nn.functional.one_hot(input_ids, parent.vocab).float()
                return type("Out", (), {"last_hidden_state": out})()

        return Decoder()

    def get_output_embeddings(self):
        table = torch.full((self.vocab, self.vocab), -10.0)
        for a, b in self.next_of.items():
            table[b, a] = 10.0
        return lambda h: h @ table.T


def test_held_out_chain_acceptance_counts_runs_of_matches_from_every_position():
    # answer 1 2 3 4 5 after prompt 9: the target's top-1 at each answer position is the answer token
    # (greedy row); the copycat predicts 1->2, 2->3 right and 3->7 wrong, 4->5 right.
    row = {"prompt_ids": [9], "answer_ids": [1, 2, 3, 4, 5], "temperature": 0}
    soft_ids = torch.tensor([[1], [2], [3], [4], [5]], dtype=torch.int32)
    held = distill.Rows.of([row], [(soft_ids, torch.zeros(5, 1, dtype=torch.float16))])
    model = Copycat(10, {9: 1, 1: 2, 2: 3, 3: 7, 4: 5})
    ev = distill.evaluate(model, held, 0, chain=3, tokens=0, compute_dtype=None)
    # matches per position: 9->1 yes, 1->2 yes, 2->3 yes, 3->4 no, 4->5 yes: runs 3, 2, 1, 0, 1 (capped at 3)
    assert ev.agreement == pytest.approx(4 / 5)
    assert ev.depth == pytest.approx([4 / 5, 2 / 5, 1 / 5])
    assert ev.mean_accepted == pytest.approx(1 + 7 / 5)
    sampled = distill.Rows.of([{**row, "temperature": 0.8}], [(soft_ids, torch.zeros(5, 1, dtype=torch.float16))])
    assert distill.evaluate(model, sampled, 0, chain=3, tokens=0, compute_dtype=None).depth == [0.0] * 3


def test_a_draft_from_all_of_the_targets_blocks_is_the_target(tiny_models):
    target = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32).model
    ids = torch.tensor([[3, 17, 29, 5, 8]])
    whole = distill.draft_from_target(target, target.config.num_hidden_layers)
    assert torch.allclose(whole(input_ids=ids).logits, target(input_ids=ids).logits, atol=1e-5)
    one = distill.draft_from_target(target, 1)
    assert one.config.num_hidden_layers == 1 and len(one.model.layers) == 1
    assert torch.equal(one.get_input_embeddings().weight, target.get_input_embeddings().weight)


def test_a_draft_of_chosen_blocks_runs_them_in_order_and_skips_the_rest(tiny_models):
    target = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32).model
    n = target.config.num_hidden_layers
    assert n >= 2
    ids = torch.tensor([[3, 17, 29, 5, 8]])
    listed = distill.draft_from_target(target, list(range(n)))
    assert torch.allclose(listed(input_ids=ids).logits, target(input_ids=ids).logits, atol=1e-5)
    first_last = distill.draft_from_target(target, [0, -1])
    assert first_last.config.num_hidden_layers == 2
    assert torch.equal(first_last.model.layers[1].mlp.down_proj.weight, target.model.layers[n - 1].mlp.down_proj.weight)
    # the same as the target with its middle blocks removed
    import copy

    skipped = copy.deepcopy(target)
    skipped.model.layers = torch.nn.ModuleList([skipped.model.layers[0], skipped.model.layers[n - 1]])
    for j, layer in enumerate(skipped.model.layers):
        layer.self_attn.layer_idx = j
    skipped.config.num_hidden_layers = 2
    assert torch.allclose(first_last(input_ids=ids).logits, skipped(input_ids=ids).logits, atol=1e-5)
    for bad in ([1, 0], [0, 0], [n], [], 0):
        with pytest.raises(SpecbenchError, match="a draft's layers"):
            distill.draft_from_target(target, bad)


def test_training_on_the_targets_answers_lowers_the_held_out_kl(tiny_models):
    loaded = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32)
    import copy

    tok = loaded.tokenizer
    target = copy.deepcopy(loaded.model)  # made peaky: a random model's next-token distribution is near uniform
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(40.0)
    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for _ in range(24):
            prompt = torch.randint(5, len(tok), (6,), generator=gen).tolist()
            answer = target.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                                     pad_token_id=tok.pad_token_id)[0, 6:].tolist()
            rows.append({"prompt_ids": prompt, "answer_ids": answer, "temperature": 0})
    from specbench.kit.corpus import teacher_topk

    soft = [(g.topk_ids, g.topk_logp) for g in teacher_topk(target, rows, 8)]
    train, held = distill.Rows.of(rows[:20], soft[:20]), distill.Rows.of(rows[20:], soft[20:])
    from specbench.zoo.train import make_model

    arch = OmegaConf.create({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                             "num_attention_heads": 2, "num_key_value_heads": 2})
    draft = make_model(arch, tok, 128, 0, 20)  # a fresh random draft: far from the target at first
    cfg = OmegaConf.create({"epochs": 8, "batch_tokens": 64, "evaluations": 2, "chain": 3, "lr": 1e-2,
                            "min_lr_ratio": 0.1, "warmup_steps": 2, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.95,
                            "grad_clip": 1.0, "kd_alpha": 0.9})
    stats = distill.train_draft(draft, train, held, cfg, pad_id=tok.pad_token_id, seed=0, desc="test draft",
                                compute_dtype=None)
    assert len(stats.curve) == 3 and stats.curve[-1].tokens == stats.tokens
    assert stats.curve[-1].kd < 0.97 * stats.curve[0].kd  # (a 1-layer, 32-wide draft on random prompts)
    assert stats.curve[-1].agreement > stats.curve[0].agreement
    assert stats.tokens == 8 * train.answer_tokens


def random_rows(target: torch.nn.Module, *, seed: int, answer: int, rows: int = 12) -> tuple[list, list, Any]:
    """`rows` corpus rows of random tokens (5-token prompts, `answer`-token answers), the target's top-4
    log-probabilities at each answer position, and its forward's output (hidden states too)."""
    gen = torch.Generator().manual_seed(seed)
    made = [{"prompt_ids": torch.randint(5, 300, (5,), generator=gen).tolist(),
             "answer_ids": torch.randint(5, 300, (answer,), generator=gen).tolist(), "temperature": 0}
            for _ in range(rows)]
    ids = torch.tensor([r["prompt_ids"] + r["answer_ids"] for r in made])
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    top = torch.log_softmax(out.logits, -1).topk(4, -1)
    return made, [(top.indices[i, 4:-1], top.values[i, 4:-1]) for i in range(rows)], out


def test_a_draft_trained_on_the_targets_states_too_comes_closer_to_them(tiny_models):
    target = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32).model
    rows, soft, out = random_rows(target, seed=2, answer=12)
    ids = torch.tensor([r["prompt_ids"] + r["answer_ids"] for r in rows])
    final = out.hidden_states[-1]  # the final-norm states, (rows, length, hidden)
    train = distill.Rows.of(rows[:8], soft[:8]).with_states(final[:8])
    assert [s.shape for s in train.states] == [(12, target.config.hidden_size)] * 8
    cfg = {"epochs": 6, "batch_tokens": 64, "evaluations": 1, "chain": 2, "lr": 3e-3, "min_lr_ratio": 0.1,
           "warmup_steps": 1, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.95, "grad_clip": 1.0, "kd_alpha": 0.9}
    held = distill.Rows.of(rows[8:], soft[8:])

    def distance(feature_weight: float) -> float:
        draft = distill.draft_from_target(target, 1)
        distill.train_draft(draft, train, held, OmegaConf.create({**cfg, "feature_weight": feature_weight}),
                            pad_id=0, seed=0, desc="test", compute_dtype=None)
        with torch.no_grad():
            mine = draft.get_decoder()(input_ids=ids[8:]).last_hidden_state[:, 4:-1]
        return float(torch.nn.functional.smooth_l1_loss(mine, final[8:, 4:-1]))

    assert distance(1.0) < 0.8 * distance(0.0)  # (0.145 against 0.259 when written)
    with pytest.raises(SpecbenchError, match="feature_weight > 0 needs the target's states"):
        distill.train_draft(distill.draft_from_target(target, 1), distill.Rows.of(rows[:8], soft[:8]), held,
                            OmegaConf.create({**cfg, "feature_weight": 1.0}), pad_id=0, seed=0, desc="test",
                            compute_dtype=None)


def test_a_stopped_draft_training_resumes_to_the_same_weights_and_curve(tiny_models, tmp_path, monkeypatch):
    from specbench.core.resume import TrainingState

    target = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32).model
    rows, soft, _ = random_rows(target, seed=3, answer=10)
    train, held = distill.Rows.of(rows[:8], soft[:8]), distill.Rows.of(rows[8:], soft[8:])
    cfg = OmegaConf.create({"epochs": 3, "batch_tokens": 32, "evaluations": 3, "chain": 2, "lr": 3e-3,
                            "min_lr_ratio": 0.1, "warmup_steps": 1, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.95,
                            "grad_clip": 1.0, "kd_alpha": 0.9})

    def run(ckpt):
        draft = distill.draft_from_target(target, 1)
        stats = distill.train_draft(draft, train, held, cfg, pad_id=0, seed=0, desc="test", compute_dtype=None,
                                    ckpt=ckpt)
        return draft, stats

    whole, whole_stats = run(None)
    state = tmp_path / "draft.progress.pt"
    real = distill.evaluate
    calls = []

    def stop_at_the_second_measurement(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the start's, the first third's, then stopped
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(distill, "evaluate", stop_at_the_second_measurement)
    with pytest.raises(KeyboardInterrupt):
        run(TrainingState(state, every_s=0))
    assert state.is_file()
    measured = []
    monkeypatch.setattr(distill, "evaluate", lambda *a, **k: measured.append(1) or real(*a, **k))
    resumed, resumed_stats = run(TrainingState(state, every_s=0))
    assert len(measured) == 2  # resumed: the second third's and the end's, not the start's and first third's again
    assert [e.as_dict() for e in resumed_stats.curve] == [e.as_dict() for e in whole_stats.curve]
    assert resumed_stats.tokens == whole_stats.tokens and resumed_stats.steps == whole_stats.steps
    for (key, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), key


def test_ragged_states_index_like_the_padded_states_where_kept(tiny_models, monkeypatch):
    from specbench.kit import features as kf

    monkeypatch.setattr(kf, "CONTEXT", 2)
    target = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32).model
    gen = torch.Generator().manual_seed(1)
    rows = [{"prompt_ids": torch.randint(5, 300, (p,), generator=gen).tolist(),
             "answer_ids": torch.randint(5, 300, (a,), generator=gen).tolist()} for p, a in ((6, 4), (2, 7), (9, 1))]
    spec = kf.StateSpec(final=True, fused=(0, 1), exit_layer=1)
    flat = kf.compute_states(target, rows, spec, batch_tokens=16)
    view = kf.ragged([(0, 2), (0, 0)], {0: rows}, {0: flat["final"]})
    for b, r in enumerate((2, 0)):
        seq = torch.tensor([rows[r]["prompt_ids"] + rows[r]["answer_ids"]])
        with torch.no_grad():
            states = target(input_ids=seq, output_hidden_states=True).hidden_states
        first = max(0, len(rows[r]["prompt_ids"]) - 2)
        got = view[torch.tensor(b), slice(0, view.shape[1])]
        assert torch.allclose(got[first:seq.shape[1]], states[-1][0, first:].to(torch.bfloat16).float())
        assert not got[:first].any() and not got[seq.shape[1]:].any()
    # gathers of (row, position) pairs and broadcast windows read the same values
    pairs = view[torch.tensor([0, 1, 1]), torch.tensor([8, 5, 0])]
    assert torch.equal(pairs[0], view[torch.tensor(0), slice(0, 12)][8]) and not pairs[2].any()
    width = target.config.hidden_size
    assert view[torch.tensor([[0], [1]]), torch.arange(3)[None] + 7].shape == (2, 3, width)
    assert flat["fused"].shape[-1] == 2 * width and len(flat["exit"]) == len(flat["final"])


def test_states_mapped_from_several_shard_files_read_as_the_states_in_memory(tiny_models, monkeypatch, tmp_path):
    from safetensors.torch import save_file

    from specbench.kit import features as kf

    monkeypatch.setattr(kf, "CONTEXT", 2)
    target = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32).model
    gen = torch.Generator().manual_seed(2)
    rows = [{"prompt_ids": torch.randint(5, 300, (p,), generator=gen).tolist(),
             "answer_ids": torch.randint(5, 300, (a,), generator=gen).tolist()} for p, a in ((6, 4), (2, 7), (9, 3))]
    spec = kf.StateSpec(final=True, fused=(0, 1))
    whole = kf.compute_states(target, rows, spec, batch_tokens=16)
    shards = {0: rows[:2], 1: rows[2:]}
    for shard, its in shards.items():
        save_file(kf.compute_states(target, its, spec, batch_tokens=16), str(tmp_path / f"s{shard}.safetensors"))
    files = {shard: kf.mapped(tmp_path / f"s{shard}.safetensors") for shard in shards}
    assert torch.equal(torch.cat([files[0]["fused"], files[1]["fused"]]), whole["fused"])
    picked = [(1, 0), (0, 1), (0, 0)]
    on_disk = kf.ragged(picked, shards, {s: f["final"] for s, f in files.items()})
    in_memory = kf.ragged([(0, 2), (0, 1), (0, 0)], {0: rows}, {0: whole["final"]})
    assert len(on_disk.chunks) == 2
    everything = (torch.arange(3)[:, None], torch.arange(on_disk.shape[1])[None])
    assert on_disk.shape == in_memory.shape and torch.equal(on_disk[everything], in_memory[everything])
    assert on_disk[everything][0].abs().sum() > 0  # the second shard's row is read, not zeros
    # a window across both shards' rows reads each from its own file
    window = (torch.tensor([[0], [2]]), torch.arange(4)[None] + 6)
    assert torch.equal(on_disk[window], in_memory[window])


def test_heads_on_a_corpus_learn_only_where_drafting_starts_and_window_near_the_answers():
    from specbench.heads.train import Features
    from specbench.kit.heads import padded_rows

    rows = [{"prompt_ids": [7] * 40, "answer_ids": [8] * 10}, {"prompt_ids": [7] * 3, "answer_ids": [9] * 30}]
    # (row 0's answer starts at 40: drafting from 39 on; row 1's at 3)
    ids, valid, loss = padded_rows(rows, 0)
    assert loss[0].nonzero().flatten().tolist() == list(range(39, 49))  # last prompt token .. last but one
    assert loss[1].nonzero().flatten().tolist() == list(range(2, 32))
    assert valid.sum(1).tolist() == [50, 33] and not (loss & ~valid).any()
    data = Features(ids, valid, torch.zeros(2, 50, 4), loss=loss)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        s = data.window_starts(torch.tensor([0, 1]), 16, gen)
        assert s[0] == 34  # a quarter of the window before the answer (35), kept inside the padded row
        assert 0 <= s[1] <= 33 - 16


def test_eagles_held_out_chain_is_exact_for_a_head_that_predicts_the_targets_own_states(tiny_models, tmp_path):
    from specbench.kit.features import StateSpec
    from specbench.kit.heads import CorpusStates, chain_acceptance
    from specbench.methods.eagle import Eagle

    target = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32).model
    gen = torch.Generator().manual_seed(3)
    rows = []
    with torch.no_grad():
        for i in range(3):
            prompt = torch.randint(5, 300, (5,), generator=gen).tolist()
            answer = target.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                     min_new_tokens=12)[0, 5:].tolist()
            rows.append({"prompt_ids": prompt, "answer_ids": answer, "temperature": 0, "shard": 0, "row": i})

    class Oracle(torch.nn.Module):
        """Predicts exactly the target's next state: runs the target on the row so far."""

        row: list[int] = []

        def forward(self, embeds, feats, positions):
            lo = int(positions[0, 0])
            drafted = embeds[0] @ target.get_input_embeddings().weight.T  # the token ids back from embeddings
            seq = self.row[:lo + 1] + drafted.argmax(-1).tolist()
            states = target(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states[-1]
            return states[:, lo + 1:]

    oracle = Oracle()
    held = CorpusStates(rows, {0: rows}, tmp_path, StateSpec(final=True), lambda: target, 0)
    for row in rows:  # one row at a time: the oracle knows the row it is asked about
        oracle.row = row["prompt_ids"] + row["answer_ids"]
        one = CorpusStates([row], {0: rows}, tmp_path, StateSpec(final=True), lambda: target, 0)
        next_state = lambda *a: Eagle.heldout_next_state(oracle, *a)  # noqa: E731 - EAGLE's own step
        assert chain_acceptance(next_state, one, target, depth=3, context=4) == [1.0, 1.0, 1.0]
    assert held.view("final").shape[0] == 3
