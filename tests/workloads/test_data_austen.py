"""Jane Austen's six novels, shipped as a folder of text assets (workloads/data/assets/austen/):
the files are the provenance note's bytes, carry no Project Gutenberg header or footer, are
packaged, and load through ``kind: text`` with the documented split and vocabulary."""

from __future__ import annotations

import fnmatch
import hashlib
import tomllib
from pathlib import Path

import pytest

from phaselab.workloads.data import ASSETS_DIR, DataConfig, TextConfig, build_dataset
from phaselab.workloads.data.text_sources import text_files

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ASSETS_DIR / "austen"
# file -> (bytes, sha256), as listed in austen/README.md
FILES = {
    "emma.txt": (883_027, "dd08b340a56ad4a0a00718d5682528a5a5886ae0aef91c9e0fa528074fa64b75"),
    "mansfieldpark.txt": (883_279, "e0e9ef3863ea77f51f6070062ee0dd50ad9b933223880617629e4e4963ea40ff"),
    "northangerabbey.txt": (433_410, "8618a5acf5be50cc6e9b7680c7469fb6012649ab08c709dfc63c6367989fd31d"),
    "persuasion.txt": (466_853, "726513a6c18bb678427bcbcf7c72d0d20816a67c25b0471b26ddcabf3ebac140"),
    "prideprejudice.txt": (684_767, "2e44edaa4946d64ad541c68e0224f5d672f43bf3ce2a8a0b0637ad5e02fc6eb3"),
    "sensesensibility.txt": (673_687, "0996d90842bbe8093f3b8142c1e77d1b20cff52d1d0615f3ed67733653e74e26"),
}
CORPUS_CHARS = 4_025_022


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def test_the_six_novels_are_the_noted_bytes_without_gutenberg_boilerplate() -> None:
    base, files = text_files("austen", root=ASSETS_DIR)
    assert base == FOLDER and [p.name for p in files] == sorted(FILES)   # README.md is not read
    for p in files:
        data = p.read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == FILES[p.name], p.name
        text = data.decode("utf-8")
        assert "\r" not in text
        for marker in ("gutenberg", "*** start of", "*** end of", "end of the project", "ebook"):
            assert marker not in text.lower(), (p.name, marker)
    assert (FOLDER / "README.md").is_file()


def test_package_data_globs_ship_the_folder() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = globs["phaselab.workloads.data"]
    for name in [*FILES, "README.md"]:
        rel = f"assets/austen/{name}"
        assert any(fnmatch.fnmatch(rel, pat) for pat in patterns), (rel, patterns)


def test_one_novel_as_a_small_slice(cache) -> None:
    """One named file: its own vocabulary and a 90/10 split of its characters."""
    ds = build_dataset(DataConfig(kind="text", block_size=64, cache_dir=cache,
                                  text=TextConfig(path="austen/persuasion.txt")))
    n_train = int(466_853 * 0.9)
    assert ds.name == "text:persuasion:char"
    assert (len(ds.tokens("train")), len(ds.tokens("valid"))) == (n_train, 466_853 - n_train)
    assert ds.vocab_size == 75
    assert ds.tokenizer.decode(ds.tokens("train")[:28]) == "Persuasion\n\n\nby\n\nJane Austen"
    assert ds.tokens("train")[:4].tolist() == [39, 53, 66, 67]   # "Pers" in the sorted character set


def test_the_corpus_split_and_vocabulary(cache) -> None:
    """The whole folder (the grid's data): sorted files concatenated, the last 10 % of the
    characters held out, i.e. the last 60 % of Sense and Sensibility."""
    ds = build_dataset(DataConfig(kind="text", block_size=512, cache_dir=cache, text=TextConfig(path="austen")))
    train, valid = ds.tokens("train"), ds.tokens("valid")
    assert ds.name == "text:austen:char" and ds.vocab_size == 81
    assert (len(train), len(valid)) == (3_622_519, 402_503) and len(train) + len(valid) == CORPUS_CHARS
    assert "".join(ds.tokenizer.chars[:12]) == "\n !\"&'()*,-."
    assert ds.tokenizer.chars[-1] == "£"
    assert train[:8].tolist() == [29, 37, 37, 25, 0, 0, 26, 78]   # "EMMA\n\nBy"
    novel = (FOLDER / "sensesensibility.txt").read_text(encoding="utf-8")
    held_out = len(novel) - len(valid)
    assert held_out == 271_184
    assert ds.tokenizer.decode(valid[:60]) == novel[held_out:held_out + 60]
    assert ds.tokenizer.decode(valid[-30:]) == novel[-30:]
    # every validation character is in the training vocabulary (char level cannot encode others)
    assert set(novel[held_out:]) <= set(ds.tokenizer.chars)
