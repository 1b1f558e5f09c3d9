"""Without the optional `tokenizers` package, asking for a BPE or a tokenizer file is a
`DataError` that names the package and its install, not a bare ModuleNotFoundError."""

from __future__ import annotations

import re
import sys

import pytest

from normlab.data import DataError
from normlab.data.tokenizer import hf_tokenizers, load_tokenizer_file


def test_a_missing_tokenizers_package_is_named_with_its_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails as if not installed
    hint = "needs Hugging Face `tokenizers`; install it with `pip install 'normlab[data]'`"
    with pytest.raises(DataError, match="^a BPE needs Hugging Face `tokenizers`"):
        hf_tokenizers("a BPE")
    want = f"reading the tokenizer {tmp_path} {hint}"
    with pytest.raises(DataError, match="^" + re.escape(want)):
        load_tokenizer_file(tmp_path)
