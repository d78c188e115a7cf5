"""A prompt encoded by the checkpoint's tokenizer.json alone (``text_inputs.prompt_tokenizer``) against
transformers' ``AutoTokenizer``: every fixture checkpoint whose tokenizer class adds nothing to its file (the deep
families' and the generic family's), and the same file under Qwen's own tokenizer class."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import ROOT
from driftscope.families.qwen_shared.tokenizer import QWEN2_TOKENIZERS
from driftscope.inputs.text_inputs import FILE_TOKENIZERS, FileTokenizer, prompt_tokenizer

FOLDER = ROOT / "fixtures" / "checkpoints"
TEXTS = [
    "Name every shape in the image and its colour.",
    "<|im_start|>user\n<|vision_start|><|image_pad|><|image_pad|><|vision_end|>What moves?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|endoftext|><im_patch><im_col> naïve café — 数字 12345  trailing spaces   \n\tand tabs",
    "",
]


def _config(path) -> dict:
    try:
        return json.loads((path / "tokenizer_config.json").read_text())
    except OSError:
        return {}


PLAIN = sorted(
    path.name
    for path in FOLDER.iterdir()
    if (path / "tokenizer.json").exists()
    and _config(path).get("tokenizer_class") in FILE_TOKENIZERS
    and not _config(path).get("add_bos_token")
)


def _same(path) -> None:
    from transformers import AutoTokenizer

    ours, theirs = prompt_tokenizer(path, QWEN2_TOKENIZERS), AutoTokenizer.from_pretrained(str(path))
    assert isinstance(ours, FileTokenizer)
    for text in TEXTS:
        assert ours(text)["input_ids"] == list(theirs(text)["input_ids"]), (path.name, text)
    assert (ours.bos_token, ours.eos_token) == (theirs.bos_token, theirs.eos_token)
    tokens = ["<|image_pad|>", "<|im_end|>", "<im_patch>", "<|endoftext|>"]
    known = [token for token in tokens if ours.convert_tokens_to_ids(token) is not None]
    assert ours.convert_tokens_to_ids(known) == theirs.convert_tokens_to_ids(known)


def test_the_fixtures_cover_the_deep_and_the_generic_families():
    assert {"tiny-qwen2_5-vl", "tiny-qwen3-vl", "tiny-qwen3-vl-moe", "tiny-molmo2-hub"} <= set(PLAIN)
    assert any(name.startswith("generic-") for name in PLAIN)


@pytest.mark.parametrize("name", PLAIN)
def test_the_file_encodes_as_transformers_does(name):
    _same(FOLDER / name)


def test_under_qwens_own_tokenizer_class_too(tmp_path):
    folder = tmp_path / "qwen2-tokenizer"
    shutil.copytree(FOLDER / "tiny-qwen2_5-vl", folder, ignore=shutil.ignore_patterns("*.safetensors"))
    config = {**_config(folder), "tokenizer_class": "Qwen2Tokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    _same(folder)


def test_qwens_class_is_read_from_the_file_only_where_a_family_names_it(tmp_path):
    folder = tmp_path / "qwen2-tokenizer"
    shutil.copytree(FOLDER / "tiny-qwen2_5-vl", folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "tokenizer_config.json").write_text(json.dumps({**_config(folder), "tokenizer_class": "Qwen2Tokenizer"}))
    assert not isinstance(prompt_tokenizer(folder), FileTokenizer)
    assert isinstance(prompt_tokenizer(folder, QWEN2_TOKENIZERS), FileTokenizer)


def test_a_tokenizer_that_adds_to_its_file_is_transformers_own(tmp_path):
    folder = tmp_path / "bos"
    shutil.copytree(FOLDER / "tiny-qwen2_5-vl", folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "tokenizer_config.json").write_text(json.dumps({**_config(folder), "add_bos_token": True}))
    assert not isinstance(prompt_tokenizer(folder), FileTokenizer)
