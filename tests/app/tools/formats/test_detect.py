"""Which tool format a model gets, from its real chat template and its vocabulary."""

import pytest

from app.chat.prompt.formats import CHATML
from app.tools.formats.detect import tool_format
from tests.tiny_models import CHATML as TINY_CHATML
from tests.tool_models import family_tokenizer, template_text

EXPECTED = {  # fixture template -> (format, whether its template offers the tools itself)
    "qwen3": ("hermes", True),
    "smollm3": ("hermes", True),
    "qwen3_5": ("qwen3_xml", True),
    "qwen3_coder": ("qwen3_xml", True),
    "llama3_2": ("llama3_json", True),
    "llama3_3": ("llama3_json", True),
    "mistral_nemo": ("mistral", True),
    "mistral_small_3_2": ("mistral_v11", True),
    "gpt_oss": ("harmony", True),
    "phi4_mini": ("phi4_mini", True),
    "lfm2": ("lfm2", True),
    "lfm2_5": ("lfm2", True),
    "gemma3": ("convention", False),
}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_each_family_is_known_by_its_template(formats, family):
    assert (formats[family].name, formats[family].native) == EXPECTED[family]


def test_a_template_without_a_tool_format_gets_the_convention(tmp_path):
    # SmolLM2's template is plain ChatML, as the tiny models' is.
    fmt = tool_format(family_tokenizer(tmp_path, "qwen3", TINY_CHATML))
    assert (fmt.name, fmt.native) == ("convention", False)


def test_a_model_without_a_template_gets_the_convention_in_its_standard_format(tmp_path):
    fmt = tool_format(family_tokenizer(tmp_path, "qwen3", None), CHATML)
    assert (fmt.name, fmt.native) == ("convention", False)


def test_a_standard_format_wins_over_a_template_the_conversation_does_not_use(tokenizers):
    assert tool_format(tokenizers["qwen3"], CHATML).name == "convention"


def test_a_hermes_template_that_never_reads_the_tools_gets_the_convention(tmp_path):
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{# the model answers with <tool_call> blocks #}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")
    fmt = tool_format(family_tokenizer(tmp_path, "qwen3", template))
    assert (fmt.name, fmt.native) == ("convention", False)


def test_of_several_named_templates_the_tool_use_one_is_read(tmp_path):
    tokenizer = family_tokenizer(tmp_path, "qwen3", TINY_CHATML)
    tokenizer.chat_template = {"default": TINY_CHATML, "tool_use": template_text("qwen3")}
    assert tool_format(tokenizer).name == "hermes"


def test_the_harmony_vocabulary_alone_says_gpt_oss(tmp_path):
    template = TINY_CHATML + "{% if tools %}{{ tools | tojson }}{% endif %}"
    assert tool_format(family_tokenizer(tmp_path, "gpt_oss", template)).name == "harmony"
