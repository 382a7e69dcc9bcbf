"""Speculative decoding: how many draft tokens a request's next step verifies, and what verifying costs.

A step after the last sampled token t can also run D draft tokens d1..dD (ngram_draft.py): one forward
over [t, d1, ..., dD] gives the logits after each. The step loop (loop.py) samples at each position with
the request's own sampler and keeps going while the sampled token equals the next draft, so a step
yields the accepted drafts plus the model's own next token, >= 1 token, and the tokens are those of
one-at-a-time decoding (greedy: the same argmax; sampling: the same sampler, RNG and logits, so the same
distribution; the draft is deterministic).

Verifying is not free: on this CPU a step over D + 1 tokens costs more than one over 1 (StepCosts
measures it, per row count). Draft length follows the recent acceptance: with per-token acceptance a,
a draft of D yields on average 1 + a + ... + a^D tokens, and the policy picks the D (0 = plain step)
with the most tokens per unit of step time. When drafts keep failing, D = 0 and drafting pauses; the
failures are forgotten slowly while paused, so a later repetitive stretch is tried again.

In a batch (continuous batching) the step is shared: a request's D drafts make the step over every
request's rows longer, and only that request gains tokens. So the policy weighs the step's tokens, the
others' one each plus the expected 1 + a + ... + a^D, against the cost of all its rows: beside 3 others
at 1.45x for 4 rows, a draft pays only at a far higher acceptance than alone (as vLLM turns speculation
off above a batch size; here the cost model says where). Measured through `kvchat serve` with 4
clients on prose, drafting as if alone cost the batched run ~10-20% of its tokens/s.
"""

from __future__ import annotations

from collections import deque

from engine.request.ngram_draft import NGramDrafter

MAX_DRAFT_TOKENS = 32  # per step; the fused CPU step takes 48 rows
DECAY = 0.9  # weight of the past in the acceptance counts, per draft verified
FORGET_WHILE_PAUSED = 0.98  # per plain step taken because drafting did not pay: failures fade
MIN_GAIN = 1.02  # a draft must promise this many times a plain step's tokens per second: costs are noisy
PROBE_EVERY = 64  # paused steps with a proposal between two single-token drafts that re-measure the cost
COST_WINDOW = 9  # recent steps per (requests, rows) whose median is their cost: one stalled step (the host
# preempted a thread, a page fault) moved a running average by a fifth of its stall for several steps
PRIOR_ROW_COST = 0.15  # a step's extra cost per extra row, relative to one row, before any is measured


class StepCosts:
    """Seconds per decode forward by (requests, rows) (the median of recent ones), as ratios to one request's one row.
    Requests count apart from rows: each request's attention reads its own K/V, so four requests' four rows
    cost more than one request's token and three drafts (1.51x against ~1.2x one row, measured on the 135M
    model); a batch's drafts priced at one request's verify costs looked cheap, and drafted 1.5-4 rows a step
    that the model then rejected."""

    def __init__(self):
        self.seconds: dict[tuple[int, int], float] = {}  # the median of each key's recent steps
        self._recent: dict[tuple[int, int], deque[float]] = {}

    def record(self, rows: int, seconds: float, requests: int = 1) -> None:
        key = (requests, rows)
        recent = self._recent.setdefault(key, deque(maxlen=COST_WINDOW))
        recent.append(seconds)
        ordered = sorted(recent)
        self.seconds[key] = ordered[len(ordered) // 2]

    def ratio(self, rows: int, requests: int = 1) -> float:
        """Cost of a step of `requests` requests over `rows` tokens relative to one request's one token: as
        measured, else the batch's measured plain step plus a prior per extra row, else the prior alone."""
        if rows == requests == 1:
            return 1.0
        one = self.seconds.get((1, 1))
        known, plain = self.seconds.get((requests, rows)), self.seconds.get((requests, requests))
        if one and known:
            return max(1.0, known / one)
        if one and plain:
            return max(1.0, plain / one) + PRIOR_ROW_COST * (rows - requests)
        return 1.0 + PRIOR_ROW_COST * (rows - 1)


class Acceptance:
    """How often the model agrees with a draft token: decayed counts of accepted tokens and of drafts cut by
    a mismatch, for the geometric estimate a = accepted / (accepted + cuts) (Beta(1, 1) prior)."""

    def __init__(self):
        self.accepted = 0.0
        self.rejected = 0.0

    @property
    def rate(self) -> float:
        return (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)

    def verified(self, proposed: int, accepted: int) -> None:
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + (1 if accepted < proposed else 0)


class Speculator:
    """One request's drafting: the n-gram index over its tokens and its recent acceptance, kept per match
    length (a draft found by a 4-token match is accepted far more often than one found by 1)."""

    def __init__(self, tokens: list[int], max_draft: int, costs: StepCosts):
        self.tokens = list(tokens)  # filed into the drafter at the first draft: not on the TTFT path
        self.drafter: NGramDrafter | None = None
        self.max_draft = max_draft
        self.costs = costs
        self.acceptance: dict[int, Acceptance] = {}  # by the match length that found the draft
        self.pending = 0  # the match length of the draft being verified
        self.paused = 0  # plain steps taken since the last draft, though a proposal was there
        self.not_paying = False  # the last proposal was not drafted because drafting did not pay (a probe aside)

    def draft(self, limit: int, others: int = 0) -> list[int]:
        """Draft tokens for the next step (at most `limit`, what the reply has room for); [] = a plain step.
        `others`: how many other requests decode in the same step (a token each)."""
        if self.drafter is None:
            self.drafter = NGramDrafter(self.tokens)  # ~0.7 ms per 1,000 tokens
            self.tokens = []  # the drafter has its own copy now
        proposal, n = self.drafter.propose(min(limit, self.max_draft))
        if not proposal:
            return []
        acceptance = self.acceptance.setdefault(n, Acceptance())
        length = self.best_length(len(proposal), acceptance.rate, others)
        self.not_paying = length == 0
        if length == 0:
            acceptance.rejected *= FORGET_WHILE_PAUSED
            self.paused += 1
            if self.paused >= PROBE_EVERY:  # verifying may have got cheaper (a shorter context, a quiet
                self.paused, length = 0, 1  # machine): measure it again now and then
        self.pending = n
        return proposal[:length]

    def best_length(self, available: int, a: float, others: int = 0) -> int:
        """The draft length (0..available) with the most expected tokens per unit of step time, at per-token
        acceptance `a`, in a step that also computes `others` rows of other requests (a token each); 0
        unless drafting promises MIN_GAIN times a plain step's rate."""
        requests = others + 1
        plain = requests / self.costs.ratio(requests, requests)
        best, best_rate, expected, power = 0, plain, 1.0, 1.0
        for d in range(1, available + 1):
            power *= a
            expected += power  # 1 + a + ... + a^d tokens from a step over d + 1 rows
            rate = (others + expected) / self.costs.ratio(requests + d, requests)
            if rate > best_rate:
                best, best_rate = d, rate
        return best if best_rate > MIN_GAIN * plain else 0

    def verified(self, proposed: int, accepted: int) -> None:
        """A step verified `proposed` draft tokens and the model agreed with the first `accepted`."""
        self.acceptance[self.pending].verified(proposed, accepted)
        self.paused = 0

    def append(self, token: int) -> None:
        if self.drafter is None:
            self.tokens.append(token)
        else:
            self.drafter.append(token)
