"""How each model family writes tool calls: a model's format is found from its chat template and vocabulary
(detect.tool_format); a ToolFormat (tool_format.py) renders a conversation with tools for it, reads its calls
from a streaming reply (stream_parser.py) and constrains its replies with an llguidance grammar (grammar.py).
Each family's markup has its module (tagged_json, xml_markup, llama_markup, mistral_markup, pythonic_markup,
harmony_markup); a model whose template has no tool format, or which has no template, is offered tools
through kvchat's own convention (convention.py). The turns a conversation with tools gives: turns.py.

    fmt = tool_format(engine.tokenizer, chat_format)
    text = fmt.render(turns, tools, chat_format, enable_thinking=False)
    grammar = fmt.grammar(tools, "auto", parallel=True)  # llguidance Lark, or None
    parser = fmt.stream_parser(tools, opens_in_thinking=prompt.opens_thinking)
    each TokenDelta: show parser.feed_token(delta.token_id); parser.started says a call is being written
    at Done: show parser.flush(); reply = parser.finish()  # ParsedReply(content, calls, error)
"""
