"""The differential tests' rule for greedy replies that should be equal: they are, or they part where the
reference's top two logits tie to TIE (a matmul over a different number of rows may round differently in
the last bit, and a near tie then picks the other token)."""

import torch

TIE = 1e-4


def assert_same_greedy(reference, prompt, ours, theirs, exact=False, what="the fast path"):
    """`reference`: an engine whose runner.logits gives the logits after a token list; `exact`: the fast
    path promises the same bits, so any difference fails."""
    ours, theirs = list(ours), list(theirs)
    if ours == theirs:
        return
    assert not exact, f"{what} changed the logits, not only their rounding"
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    logits = reference.runner.logits(list(prompt) + theirs[:i])[-1]
    top = torch.topk(logits.float(), 2).values
    assert float(top[0] - top[1]) < TIE, f"{what} changed greedy token {i} without a numerical tie"
