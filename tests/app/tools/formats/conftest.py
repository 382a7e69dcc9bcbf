"""The tool format tests' fixtures: each family's tokenizer with its real chat template, and its format."""

import pytest

from app.tools.formats.detect import tool_format
from tests.tool_models import FAMILIES, family_tokenizer


@pytest.fixture(scope="session")
def tokenizers(tmp_path_factory):
    """family (a fixture template's name) -> its tokenizer."""
    root = tmp_path_factory.mktemp("tool-families")
    return {family: family_tokenizer(root / family, family) for family in FAMILIES}


@pytest.fixture(scope="session")
def formats(tokenizers):
    """family -> the tool format detected for it."""
    return {family: tool_format(tokenizer) for family, tokenizer in tokenizers.items()}
