"""The message box's token meter: counts and what it says."""

from app.tui.token_meter import TokenCount, count_tokens, estimate_tokens, meter_text, room_left


def test_without_a_tokenizer_the_count_is_an_estimate_of_four_characters_a_token():
    assert estimate_tokens("") == TokenCount(0, estimated=True)
    assert estimate_tokens("abcde") == TokenCount(2, estimated=True)
    assert count_tokens("x" * 400, None) == TokenCount(100, estimated=True)


def test_with_the_models_tokenizer_the_count_is_exact(tiny_engine):
    # The tiny model's byte tokenizer: one token a UTF-8 byte.
    assert count_tokens("héllo", tiny_engine.tokenizer) == TokenCount(6, estimated=False)


def test_the_meter_says_the_tokens_and_the_room_left():
    assert meter_text(TokenCount(1234, False), 8192, 0) == "1,234 tokens · 6,958 of 8,192 left"
    assert meter_text(TokenCount(1, False), 8192, 100) == "1 token · 8,091 of 8,192 left"
    assert room_left(TokenCount(1234, False), 8192, 1000) == 5958


def test_a_message_the_window_cannot_hold_with_a_reply_is_over():
    assert meter_text(TokenCount(9000, False), 8192, 0) == "9,000 tokens · 809 over the 8,192-token window"
    assert meter_text(TokenCount(8192, False), 8192, 0) == "8,192 tokens · 1 over the 8,192-token window"
    assert meter_text(TokenCount(8191, False), 8192, 0) == "8,191 tokens · 1 of 8,192 left"


def test_an_estimate_says_so_and_an_unknown_window_is_na():
    assert meter_text(TokenCount(300, True), 4096, 96) == "≈ 300 tokens · ≈ 3,700 of 4,096 left"
    assert meter_text(TokenCount(300, True), 0, 0) == "≈ 300 tokens · window n/a"
