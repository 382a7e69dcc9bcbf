"""NGramDrafter: draft tokens found in the request's own tokens (prompt lookup decoding).

A chat reply repeats its context all the time: code the user pasted and asks to change, a passage to
quote, names, the model's own earlier answer. The drafter looks up the most recent earlier occurrence
of the sequence's last n tokens (n from MAX_N down to MIN_N: a longer match predicts better) and
proposes the tokens that followed it (continued periodically past the sequence's end). One dict per n maps an n-gram to the position after its latest
occurrence, so a lookup is MAX_N - MIN_N + 1 dict probes and an appended token MAX_N inserts, whatever
the conversation's length.

The index lags one token behind the sequence: the n-grams ending at the last token are filed only when
the next token arrives, so a lookup of the last n tokens finds an *earlier* occurrence, never itself.
"""

from __future__ import annotations

MIN_N = 1  # a one-token match predicts little, but the speculator learns per n how much (speculation.py)
MAX_N = 4


class NGramDrafter:
    def __init__(self, tokens: list[int]):
        self.tokens: list[int] = []
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(MIN_N, MAX_N + 1)}
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        """Append `tokens`, filing every n-gram that now has a token after it."""
        start = len(self.tokens)
        self.tokens += tokens
        t = self.tokens
        for n, latest in self.latest.items():
            # n-grams ending at positions start-1 .. len-2, each mapped to the position after it; built in C
            # (zip, dict.update), later occurrences overwriting earlier ones.
            first = max(0, start - n)
            ends = range(first + n, len(t))
            latest.update(zip(zip(*(t[first + i : len(t) - n + i] for i in range(n))), ends))

    def append(self, token: int) -> None:
        self.extend([token])

    def propose(self, limit: int) -> tuple[list[int], int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the longest matching tail, and
        that tail's length n (0: no match)."""
        t = self.tokens
        if limit <= 0:
            return [], 0
        for n in range(MAX_N, MIN_N - 1, -1):
            if len(t) <= n:
                continue
            after = self.latest[n].get(tuple(t[-n:]))
            if after is not None:
                # What followed, and past the end of the sequence the same again: a sequence that repeats
                # with period p = len(t) - after goes on repeating (a loop, a list, a table's rows).
                proposal = t[after : after + limit]
                period = len(t) - after
                while len(proposal) < limit:
                    proposal.append(proposal[len(proposal) - period])
                return proposal, n
        return [], 0
