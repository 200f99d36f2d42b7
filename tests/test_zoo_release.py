"""specbench.zoo.release: the zoo's built folders published as wheels and fetched instead of trained.

A stand-in index (a folder of wheels, pip's `--find-links` through PIP_FIND_LINKS, PyPI switched off
with PIP_NO_INDEX) serves wheels made by `release.release` from small fake folders.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from specbench.core.errors import SpecbenchError
from specbench.core.origin import ORIGIN_FILE, read_origin
from specbench.zoo import release, store
from specbench.zoo.parts import _built
from specbench.zoo.shipped import WEIGHTS_VAR

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds


def fake_folder(root: Path, name: str) -> Path:
    """A built-looking folder: a card written last, weights, and a pickle copy that must not ship."""
    folder = root / name
    (folder / "target").mkdir(parents=True)
    (folder / "target" / "model.safetensors").write_bytes(os.urandom(4096))
    (folder / "target" / "config.json").write_text('{"hidden_size": 8}\n')
    (folder / "target" / "pytorch_model.bin").write_bytes(b"pickle")
    (folder / "CARD").write_text(json.dumps({"name": name}) + "\n")
    return folder


def files_of(folder: Path) -> dict[str, bytes]:
    """The folder's files, but the origin that restoring, fetching or training writes (specbench.core.origin)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ORIGIN_FILE}


@pytest.fixture(autouse=True)
def no_shipped_weights(tmp_path, monkeypatch):
    """The checkout's shipped weights out of the way: these folders come from the index or from training."""
    monkeypatch.setenv(WEIGHTS_VAR, str(tmp_path / "no-shipped-weights"))


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A published folder `abc123def456.heads-0a1b2c3d`: its wheel in a stand-in index, the manifest naming it,
    pip pointed at that index only, the original moved away; returns (zoo root, folder's files, manifest)."""
    for var in (store.BUILD_VAR, release.FETCH_VAR):
        monkeypatch.delenv(var, raising=False)
    built = fake_folder(tmp_path / "built", "abc123def456.heads-0a1b2c3d")
    manifest = tmp_path / "release.json"
    wheels = release.release([built], "1.0.0", tmp_path / "index", manifest)
    assert [(w.dist, made) for w, made in wheels] == [("specbench-zoo-heads", True)]
    monkeypatch.setenv(release.MANIFEST_VAR, str(manifest))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    expected = {k: v for k, v in files_of(built).items() if not k.endswith(".bin")}
    return tmp_path / "zoo", expected, manifest


def must_not_train(tmp: Path) -> None:
    raise AssertionError("trained although a published copy was there")


def trains(tmp: Path) -> None:
    (tmp / "CARD").write_text('{"trained": "here"}\n')


def test_a_published_folder_is_fetched_not_trained_and_ships_no_pickle(index, capsys):
    root, expected, _ = index
    final = _built(root / "abc123def456.heads-0a1b2c3d", "CARD", "the heads", must_not_train)
    assert files_of(final) == expected  # byte for byte, pytorch_model.bin left out
    assert read_origin(final)["source"] == "published"
    err = capsys.readouterr().err
    assert "fetching abc123def456.heads-0a1b2c3d (specbench-zoo-heads 1.0.0" in err and "fetched" in err
    assert _built(final, "CARD", "the heads", must_not_train) == final  # cached now: no second download
    assert "fetching" not in capsys.readouterr().err


def test_the_same_folder_and_version_make_the_same_wheel(tmp_path):
    folder = fake_folder(tmp_path, "abc123def456")
    one = release.make_wheel(folder, "1.0.0", tmp_path / "one")
    two = release.make_wheel(folder, "1.0.0", tmp_path / "two")
    assert one.dist == "specbench-zoo-models" and one.sha256 == two.sha256
    with zipfile.ZipFile(tmp_path / "one" / one.wheel) as archive:
        assert not [n for n in archive.namelist() if n.endswith(".bin")]


def test_a_new_release_keeps_the_published_wheels_of_unchanged_folders(tmp_path):
    """Only a folder the manifest does not name yet gets a wheel (the index refuses a file uploaded twice)."""
    zoo = fake_folder(tmp_path / "built", "abc123def456")
    heads = fake_folder(tmp_path / "built", "abc123def456.heads-0a1b2c3d")
    manifest = tmp_path / "release.json"
    first = release.release([zoo, heads], "1.0.0", tmp_path / "one", manifest)
    newer = fake_folder(tmp_path / "built", "abc123def456.heads-99999999")  # a heads setting changed
    second = release.release([zoo, newer], "2.0.0", tmp_path / "two", manifest)
    assert [(w.folder, w.version, made) for w, made in second] == [
        ("abc123def456", "1.0.0", False), ("abc123def456.heads-99999999", "2.0.0", True)]
    assert second[0][0] == first[0][0]
    assert [p.name for p in (tmp_path / "two").iterdir()] == ["specbench_zoo_heads-2.0.0-py3-none-any.whl"]
    assert set(json.loads(manifest.read_text())["folders"]) == {"abc123def456", "abc123def456.heads-99999999"}


def test_a_wheel_whose_hash_differs_from_the_manifest_is_refused_and_the_folder_trained(index, capsys):
    root, _, manifest = index
    data = json.loads(manifest.read_text())
    data["folders"]["abc123def456.heads-0a1b2c3d"]["sha256"] = "0" * 64  # what a tampered index would serve
    manifest.write_text(json.dumps(data))
    final = _built(root / "abc123def456.heads-0a1b2c3d", "CARD", "the heads", trains)
    assert json.loads((final / "CARD").read_text()) == {"trained": "here"}
    err = capsys.readouterr().err
    assert "could not fetch abc123def456.heads-0a1b2c3d (pip: " in err and "HASHES" in err
    assert "training the heads into" in err


def test_an_index_without_the_wheel_means_training_here(index, tmp_path, monkeypatch, capsys):
    root, _, _ = index
    empty = tmp_path / "empty-index"
    empty.mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    final = _built(root / "abc123def456.heads-0a1b2c3d", "CARD", "the heads", trains)
    assert (final / "CARD").read_text() == '{"trained": "here"}\n'
    assert "could not fetch" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["not published", "fetch off"])
def test_no_download_when_not_published_or_switched_off(index, monkeypatch, case):
    root, _, _ = index
    name = "abc123def456.other-99999999" if case == "not published" else "abc123def456.heads-0a1b2c3d"
    if case == "fetch off":
        monkeypatch.setenv(release.FETCH_VAR, "0")

    def no_pip(*args, **kwargs):
        raise AssertionError("pip was run")

    monkeypatch.setattr(subprocess, "run", no_pip)
    final = _built(root / name, "CARD", "the part", trains)
    assert (final / "CARD").is_file()


@pytest.mark.parametrize("marked", ["its own hash", "another hash"])
def test_the_zoo_itself_is_fetched_with_its_marker(tmp_path, monkeypatch, capsys, marked):
    """ensure_zoo on an empty cache takes the published zoo under its hash (its card printed), never training;
    a published folder marked as another zoo is an error, not a zoo that would be fetched again and again."""
    for var in (store.BUILD_VAR, release.FETCH_VAR):
        monkeypatch.delenv(var, raising=False)
    cfg = store.load_zoo_config()
    digest = store.zoo_hash(cfg)
    built = tmp_path / "built" / digest
    built.mkdir(parents=True)
    (built / "quality.json").write_text(json.dumps({"zoo_hash": digest}) + "\n")
    mark = digest if marked == "its own hash" else "0123456789ab"
    (built / store.COMPLETE).write_text(json.dumps({"zoo_hash": mark, "finished": "then"}) + "\n")
    release.release([built], "2.0.0", tmp_path / "index", tmp_path / "release.json")  # a new manifest
    monkeypatch.setenv(release.MANIFEST_VAR, str(tmp_path / "release.json"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    monkeypatch.setenv(store.ENV_VAR, str(tmp_path / "zoo"))
    monkeypatch.setattr("specbench.zoo.card.format_card", lambda card: f"card of {card['zoo_hash']}")
    monkeypatch.setattr("specbench.zoo.build.build", must_not_train)
    if marked == "another hash":
        with pytest.raises(SpecbenchError, match="marked as zoo 0123456789ab"):
            store.ensure_zoo(cfg)
        assert not (tmp_path / "zoo" / digest).exists()
        return
    folder = store.ensure_zoo(cfg)
    assert folder == tmp_path / "zoo" / digest and store.is_complete(folder)
    assert f"card of {digest}" in capsys.readouterr().err


def wheel_with(path: Path, member: str) -> release.Wheel:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, b"x")
    return release.Wheel(folder="abc123def456", dist="specbench-zoo-models", version="1", wheel=path.name,
                         sha256=release.sha256_of(path), bytes=path.stat().st_size)


@pytest.mark.parametrize("member, problem", [
    ("specbench_zoo_models/abc123def456/../../escape.json", "outside its folder"),
    ("specbench_zoo_models/abc123def456/head/weights.pt", "pickle"),
])
def test_unpacking_refuses_files_outside_the_folder_and_pickles(tmp_path, member, problem):
    wheel = wheel_with(tmp_path / "w.whl", member)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SpecbenchError, match=problem):
        release.unpack(tmp_path / "w.whl", wheel, out)
    assert not (tmp_path / "escape.json").exists()


def test_the_committed_manifest_names_folders_this_code_builds():
    """Every wheel in the package's release.json is a specbench-zoo-* distribution pinned by a SHA-256, and its
    folder is named like one of the zoo's (the zoo's hash, then a part and its key)."""
    data = json.loads(release.MANIFEST.read_text())  # empty until a release is published (docs/setup.md)
    assert isinstance(data["folders"], dict)
    for folder, entry in data["folders"].items():
        assert entry["dist"] == release.dist_name(folder) and len(entry["sha256"]) == 64
        assert entry["wheel"] == f"{entry['dist'].replace('-', '_')}-{entry['version']}-py3-none-any.whl"
        assert len(folder.split(".")[0]) == 12
