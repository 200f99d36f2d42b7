"""Decoder stacks beyond Llama: heads trained and self-speculative decoding on a tiny GPT-2
(learned positions, `transformer.h`, Conv1D blocks, tied LM head), lossless against the
baseline; head configs from any decoder's config; train-head's pad id; bad head inputs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GPT2Config, LlamaConfig

from helpers import (
    EMPTY,
    PROMPTS,
    assert_matches_baseline,
    assert_one_line_error,
    cli,
    method_cfg,
    prompt_of,
    save_tiny,
)
from specbench.core.errors import SpecbenchError
from specbench.engine.layers import LayerSkipper, decoder_blocks
from specbench.heads.eagle import EagleHead, head_config_for
from specbench.models import LoadedModel
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")


# The tiny GPT-2 (n_inner unset: MLP 4 x width) and Llama: conftest's session `target_folders` and `targets`.


def greedy_chats(target: LoadedModel, path: Path, n_new: int = 60) -> Path:
    """The target's own greedy answers to the test prompts as chat records (so drafts get accepted)."""
    records = []
    for turns in PROMPTS:
        ids = prompt_of(target, turns)
        with torch.no_grad():
            out = target.model.generate(ids, max_new_tokens=n_new, do_sample=False, min_new_tokens=n_new,
                                        pad_token_id=target.tokenizer.eos_token_id)
        answer = target.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        records.append({"messages": [{"role": "user", "content": turns[0]}, {"role": "assistant", "content": answer}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in records * 4), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def gpt2_heads(target_folders, targets, tmp_path_factory) -> dict[str, Path]:
    """An EAGLE and a Medusa head for the GPT-2, trained by `train-head` (a few seconds each) on the
    GPT-2's greedy chats: the command end to end on a GPT-2, so not conftest's session heads."""
    root = tmp_path_factory.mktemp("gpt2-heads")
    corpus = greedy_chats(targets["gpt2"], root / "chats.jsonl")
    out = {}
    medusa = ["method.train.num_heads=3", "method.train.train_projections=true", "lr=0.01"]
    for name, extra in (("eagle", ["lr=0.005"]), ("medusa", medusa)):
        result = cli("train-head", f"method={name}", "model=local", f"model.path={target_folders['gpt2']}",
                     f"corpus={corpus}", f"out={root / name}", "tokens=4000", "steps=40", "seq_len=256",
                     "threads=1", *extra, cwd=root)
        assert result.code == 0, result
        assert "saved to" in result.err
        out[name] = root / name
    return out


# --- head configs from any decoder's config ----------------------------------------------------


def test_head_config_reads_gpt2_names_and_defaults():
    config = head_config_for(GPT2Config(vocab_size=320, n_embd=48, n_layer=3, n_head=6, n_positions=128,
                                        layer_norm_epsilon=1e-4))
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (48, 6, 6)
    assert config.intermediate_size == 4 * 48  # n_inner=None: GPT-2's MLP is 4 x width
    assert config.head_dim == 8 and config.vocab_size == 320 and config.max_position_embeddings == 128
    assert config.rms_norm_eps == 1e-4 and config.hidden_act == "gelu_new"
    assert config.rope_parameters["rope_type"] == "default"  # learned positions: the head gets default RoPE
    assert head_config_for(GPT2Config(n_embd=48, n_head=6, n_inner=100)).intermediate_size == 100
    llama = head_config_for(LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                                        num_key_value_heads=2, rms_norm_eps=1e-5))
    assert (llama.intermediate_size, llama.num_key_value_heads, llama.rms_norm_eps) == (96, 2, 1e-5)


@pytest.mark.parametrize("model_type", ["gpt_neox", "opt", "phi", "falcon"])
def test_heads_build_and_run_on_other_configs(model_type):
    """Partial rotary (GPT-NeoX, Phi), ffn_dim (OPT), layer_norm_epsilon (Falcon): a head that runs."""
    config = AutoConfig.for_model(model_type, vocab_size=50, hidden_size=32, num_attention_heads=4,
                                  num_hidden_layers=1)
    head = EagleHead(head_config_for(config))
    out = head(torch.randn(1, 3, 32), torch.randn(1, 3, 32), torch.arange(3)[None])
    assert out.shape == (1, 3, 32) and torch.isfinite(out).all()


def test_head_config_without_sizes_is_refused():
    class EncoderishConfig:  # names none of the sizes
        vocab_size = 100
        d_ff = 64

    with pytest.raises(SpecbenchError, match="cannot size a head for EncoderishConfig"):
        head_config_for(EncoderishConfig())


# --- trained heads on GPT-2: lossless, and drafts get accepted ----------------------------------


@pytest.mark.parametrize("name", ["eagle", "eagle2", "medusa"])
def test_gpt2_heads_greedy_equal_the_baseline(targets, gpt2_heads, name):
    target = targets["gpt2"]
    folder = gpt2_heads["medusa" if name == "medusa" else "eagle"]
    overrides = {"total_tokens": 16} if name == "eagle2" else {"num_nodes": 16}
    method = build_method(method_cfg(name, head=str(folder), **overrides), target, EMPTY)
    results = assert_matches_baseline(method, target, lengths=(1, 30))
    assert all("tree_fallback" not in r.stats for r in results)  # GPT-2 takes the tree mask
    assert any(r.stats.get("tree_steps", 0) for r in results)
    assert sum(r.stats["accepted_tokens"] for r in results) > 0


# --- train-head's pad id ------------------------------------------------------------------------


def test_train_head_falls_back_from_a_pad_id_beyond_the_embedding(target_folders, tmp_path):
    """A tokenizer that adds its pad token after the model's vocabulary: EOS pads, said once."""
    folder = tmp_path / "gpt2-pad"
    shutil.copytree(target_folders["gpt2"], folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"pad_token": "<|pad|>"})
    tok.save_pretrained(folder)
    assert tok.pad_token_id == 320 and AutoConfig.from_pretrained(folder).vocab_size == 320
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"the quick brown fox number {i} " * (1 + i % 4)}) + "\n"
                              for i in range(12)))
    result = cli("train-head", "method=medusa", "model=local", f"model.path={folder}", f"corpus={corpus}",
                 f"out={tmp_path / 'head'}", "tokens=400", "steps=2", "seq_len=64", "threads=1", cwd=tmp_path)
    assert result.code == 0, result
    notes = [line for line in result.err.splitlines() if "pad id 320 is beyond the model's 320 embeddings" in line]
    assert len(notes) == 1 and f"id {tok.eos_token_id} (EOS)" in notes[0]
    assert (tmp_path / "head" / "medusa_lm_head.safetensors").is_file()


# --- self-speculative decoding on any stack -----------------------------------------------------


def test_decoder_blocks_are_found_by_their_count(targets):
    assert decoder_blocks(targets["gpt2"].model)[0] == "transformer.h"
    assert decoder_blocks(targets["llama"].model)[0] == "model.layers"
    opt = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "opt", vocab_size=50, hidden_size=32, word_embed_proj_dim=32, ffn_dim=64, num_hidden_layers=3,
        num_attention_heads=4))
    assert decoder_blocks(opt)[0] == "model.decoder.layers"


def more_targets(tokenizer) -> dict[str, LoadedModel]:
    """OPT (model.decoder.layers, learned positions with an offset; eager attention, so the model
    builds a mask even for one query) and a Qwen2 whose layers alternate sliding-window (12
    tokens, shorter than the prompts) and full attention."""
    common = dict(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    configs = {
        "opt": AutoConfig.for_model("opt", **common, ffn_dim=128, word_embed_proj_dim=64),
        "qwen2-sliding": AutoConfig.for_model("qwen2", **common, intermediate_size=128, num_key_value_heads=2,
                                              use_sliding_window=True, sliding_window=12,
                                              layer_types=["sliding_attention", "full_attention"]),
    }
    out = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        impl = "eager" if name == "opt" else "sdpa"
        model = AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()
        out[name] = LoadedModel(model, tokenizer, f"tiny-{name}", CPU, torch.float32)
    return out


@pytest.mark.parametrize("arch", ["gpt2", "llama", "opt", "qwen2-sliding"])
def test_self_spec_greedy_equals_baseline(targets, arch):
    target = targets[arch] if arch in targets else more_targets(targets["llama"].tokenizer)[arch]
    blocks = decoder_blocks(target.model)[1]
    layer_types = getattr(target.model.config, "layer_types", None)
    for skip in ([1], [0]):  # skipping block 0 leaves the cache's first layer behind: its length is redirected
        # threshold 0: every draft runs to max_draft, the skipped layers' entries lagging ever further
        method = build_method(method_cfg("self_spec", skip_layers=skip, threshold=0.0, adaptive=False, budget="fixed"),
                              target, EMPTY)  # fixed: a measured draft budget could cut a chain short
        results = assert_matches_baseline(method, target, lengths=(1, 30))
        assert max(n for r in results for n in r.stats["draft_lengths"]) == 8
        # the block list and the per-layer settings are the model's own again
        assert len(blocks) == 2 and all(b is a for a, b in zip(decoder_blocks(target.model)[1], blocks))
        assert getattr(target.model.config, "layer_types", None) == layer_types


@torch.no_grad()
def test_layer_skipper_on_gpt2_writes_and_rolls_back_only_kept_blocks(targets):
    target = targets["gpt2"]
    ids = prompt_of(target, PROMPTS[1])
    past = ids.shape[1] - 1
    cache = target.new_cache()
    target.model(input_ids=ids[:, :-1], cache=cache, use_cache=True)
    full = LayerSkipper(target.model, [])
    assert torch.allclose(full.step(ids[0, -1], past, cache), target.model(input_ids=ids).logits[0, -1], atol=1e-4)
    full.rollback(cache, past)
    skipper = LayerSkipper(target.model, [0])
    first = skipper.step(ids[0, -1], past, cache)
    assert [layer.get_seq_length() for layer in cache.layers] == [past, past + 1]
    skipper.step(first.argmax(), past + 1, cache)  # position past + 1 though block 0's cache holds `past`
    skipper.rollback(cache, past)
    assert [layer.get_seq_length() for layer in cache.layers] == [past, past]
    assert torch.equal(skipper.step(ids[0, -1], past, cache), first)


def test_unsupported_stacks_are_named():
    class NoList(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = LlamaConfig(num_hidden_layers=3)
            self.blocks = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))

    with pytest.raises(SpecbenchError, match=r"cannot skip layers of NoList.*model\.layers.*transformer\.h"):
        decoder_blocks(NoList())
    # Linear-attention layers keep a recurrent state that a draft cannot roll back: the probe refuses them.
    hybrid = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "qwen3_next", vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_num_value_heads=2, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=16, shared_expert_intermediate_size=16)).eval()
    refused = r"^cannot skip layers of Qwen3NextForCausalLM \(model\.layers\): .*; use a method that runs every layer"
    with pytest.raises(SpecbenchError, match=refused):
        LayerSkipper(hybrid, [1])


# --- bad input: train-head and head folders -----------------------------------------------------


def _corrupt(name: str, heads: dict[str, Path], root: Path) -> tuple[str, Path]:
    """(method, head folder) for one bad head case, built under `root`."""
    eagle, medusa = heads["eagle"], heads["medusa"]

    def copy(src: Path) -> Path:
        dst = root / name
        shutil.copytree(src, dst)
        return dst

    def edit_config(folder: Path, **changes) -> Path:
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    if name == "missing-folder":
        return "eagle", root / "no-such-head"
    if name == "no-config":
        folder = copy(eagle)
        (folder / "config.json").unlink()
        return "eagle", folder
    if name == "config-not-json":
        folder = copy(medusa)
        (folder / "config.json").write_text("{medusa_num_heads: 3")
        return "medusa", folder
    if name == "config-without-hidden-size":
        folder = copy(eagle)
        config = json.loads((folder / "config.json").read_text())
        del config["hidden_size"]
        (folder / "config.json").write_text(json.dumps(config))
        return "eagle2", folder
    if name == "config-heads-not-a-number":
        return "eagle", edit_config(copy(eagle), num_attention_heads="four")
    if name == "no-weights":
        folder = copy(eagle)
        for f in ("model.safetensors", "pytorch_model.bin"):
            (folder / f).unlink()
        return "eagle", folder
    if name == "truncated-safetensors":
        folder = copy(eagle)
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
        return "eagle", folder
    if name == "garbage-pickle":
        folder = copy(medusa)
        (folder / "medusa_lm_head.safetensors").unlink()
        (folder / "medusa_lm_head.pt").write_bytes(b"not a checkpoint " * 40)
        return "medusa", folder
    if name == "empty-pickle":
        folder = copy(eagle)
        (folder / "model.safetensors").unlink()
        (folder / "pytorch_model.bin").write_bytes(b"")
        return "eagle", folder
    if name == "other-hidden-size":
        return "eagle", edit_config(copy(eagle), hidden_size=128)
    if name == "other-vocab":
        return "eagle2", edit_config(copy(eagle), vocab_size=32000)
    if name == "medusa-for-eagle":
        return "eagle", medusa
    if name == "eagle-for-medusa":
        return "medusa", eagle
    if name == "zero-medusa-heads":
        return "medusa", edit_config(copy(medusa), medusa_num_heads=0)
    if name == "config-says-wider-mlp":
        return "eagle", edit_config(copy(eagle), intermediate_size=512)
    raise AssertionError(name)


HEAD_CASES = [
    ("missing-folder", r"head '.*no-such-head' is not a folder"),
    ("no-config", r"EAGLE head folder .* has no config\.json"),
    ("config-not-json", r"Medusa head config .*config\.json is not valid JSON"),
    ("config-without-hidden-size", r"has no 'hidden_size'"),
    ("config-heads-not-a-number", r"num_attention_heads is 'four', expected a positive integer"),
    ("no-weights", r"has none of model\.safetensors, pytorch_model\.bin"),
    ("truncated-safetensors", r"cannot read head weights .*model\.safetensors"),
    ("garbage-pickle", r"cannot read head weights .*medusa_lm_head\.pt: it is not a complete PyTorch checkpoint"),
    ("empty-pickle", r"cannot read head weights .*pytorch_model\.bin"),
    ("other-hidden-size", r"hidden size 128 but the target has 64"),
    ("other-vocab", r"vocabulary of 32000 tokens, the target has 320"),
    ("medusa-for-eagle", r"holds a Medusa head, not an EAGLE one"),
    ("eagle-for-medusa", r"holds an EAGLE head, not a Medusa one"),
    ("zero-medusa-heads", r"medusa_num_heads=0 and medusa_num_layers=1; a head folder needs >= 1 head"),
    ("config-says-wider-mlp", r"mlp\.gate_proj\.weight has shape \(256, 64\), its config\.json implies \(512, 64\)"),
]

TRAIN_CASES = [
    (["method=sps", "model=tiny"], r"train-head needs method=eagle, .*medusa, .*\(got method=sps\)"),
    (["model=tiny"], r"train-head needs method=eagle, [a-z0-9, ]+; usage"),
    (["method=eagle"], r"train-head needs model=NAME"),
    (["method=eagle", "model=nope"], r"unknown model 'nope'"),
    (["method=medusa", "model=local"], r"model=local needs model\.path="),
    (["method=medusa", "model=local", "model.path={root}/absent"], r"absent.*does not exist"),
    (["method=eagle", "model=local", "model.path={gpt2}", "steps=0"], r"setting 'steps' must be >= 1, got 0"),
    (["method=eagle", "model=local", "model.path={gpt2}", "steps=-5"], r"setting 'steps' must be >= 1, got -5"),
    (["method=medusa", "model=local", "model.path={gpt2}", "steps=ten"], r"bad setting 'steps'.*'ten'"),
    (["method=medusa", "model=local", "model.path={gpt2}", "lr=0"], r"setting 'lr' must be a positive number, got 0"),
    (["method=medusa", "model=local", "model.path={gpt2}", "out={root}/a-file"], r"a-file is a file, not a folder"),
    (["method=medusa", "model=local", "model.path={gpt2}", "out={root}/a-file/head"], r"a-file is a file"),
    (["method=eagle", "model=local", "model.path={gpt2}", "heads=3"],
     r"heads= is a setting of the method's recipe now: give method\.train\.num_heads=VALUE"),
    (["method=eagle2", "model=local", "model.path={gpt2}"], r"eagle2 drafts on eagle's head: train method=eagle"),
    (["method=hydra", "model=local", "model.path={gpt2}", "method.train.num_layers=0"],
     r"setting 'num_layers' must be >= 1, got 0"),
    (["method=hydra", "model=local", "model.path={gpt2}", "method.train.colour=red"],
     r"Could not override 'method\.train\.colour'.*method\.train\.KEY"),
    (["method=eagle3", "model=local", "model.path={gpt2}", "feature_layers=2,4,8"],
     r"feature_layers: give one value \(a list is written feature_layers=\[a,b\]\)"),
    (["method=medusa", "model=local", "model.path={gpt2}", "method.train.train_projections=maybe"],
     r"train_projections.*maybe"),
    (["method=medusa", "model=local", "model.path={gpt2}", "threads=0"], r"threads=0 must be at least 1"),
    (["method=medusa", "model=local", "model.path={gpt2}", "colour=red"], r"unknown train-head key 'colour'"),
    (["method=medusa", "model=local", "model.path={gpt2}", "steps"], r"takes key=value arguments, got 'steps'"),
    (["method=medusa", "model=local", "model.path={gpt2}", "corpus={root}/none.jsonl"], r"none\.jsonl"),
    (["method=eagle", "model=local", "model.path={gpt2}", "corpus={root}/short.jsonl", "seq_len=6"],
     r"EAGLE training needs rows of at least 8 real tokens"),
    (["method=medusa", "model=local", "model.path={gpt2}", "corpus={root}/short.jsonl", "seq_len=4",
      "method.train.num_heads=4"],
     r"Medusa training needs documents of at least 6 tokens"),
    (["method=medusa", "model=local", "model.path={small}", "corpus={root}/short.jsonl"],
     r"its tokenizer makes token ids up to \d+ but its embedding has only 100 rows"),
]


@pytest.fixture(scope="module")
def bad_input_root(target_folders, gpt2_heads, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-heads")
    (root / "q.jsonl").write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["the quick fox"]}) + "\n")
    (root / "a-file").write_text("not a folder")
    (root / "short.jsonl").write_text("".join(json.dumps({"text": f"the fox {i}"}) + "\n" for i in range(6)))
    tok = AutoTokenizer.from_pretrained(target_folders["gpt2"])
    small = save_tiny(root / "small-vocab", GPT2Config(vocab_size=100, n_embd=16, n_layer=1, n_head=2), tok)
    return {"root": root, "gpt2": target_folders["gpt2"], "small": small}


@pytest.mark.parametrize(("case", "pattern"), [*HEAD_CASES, *((" ".join(a), p) for a, p in TRAIN_CASES)],
                         ids=[c for c, _ in HEAD_CASES] + [f"train-head {' '.join(a)}" for a, _ in TRAIN_CASES])
def test_bad_head_inputs(bad_input_root, gpt2_heads, case, pattern):
    root = bad_input_root["root"]
    if case in dict(HEAD_CASES):
        method, folder = _corrupt(case, gpt2_heads, root)
        result = cli("run", f"method={method}", "model=local", f"model.path={bad_input_root['gpt2']}",
                     f"method.head={folder}", "dataset=spec_bench", f"dataset.path={root / 'q.jsonl'}",
                     f"output_dir={root / 'runs' / case}", "limit=1", "max_new_tokens=8", cwd=root)
    else:
        args = [a.format(root=root, gpt2=bad_input_root["gpt2"], small=bad_input_root["small"])
                for a in case.split(" ")]
        threads = [] if any(a.startswith("threads=") for a in args) else ["threads=1"]
        result = cli("train-head", *args, *threads, cwd=root)
    assert_one_line_error(result, pattern)
