"""How many examples a hypothesis property runs, by the profile tests/conftest.py loads.

Each property names its count for the `ci` profile, the default and what CI runs. The `dev` profile
(HYPOTHESIS_PROFILE=dev, which `make check` sets) runs a tenth of it, at least 5, so an edit is checked in
seconds and the full search still runs before a landing.
"""

from hypothesis import settings

CI_EXAMPLES = 100  # the `ci` profile's max_examples


def examples(ci_count: int) -> int:
    scale = settings.default.max_examples / CI_EXAMPLES
    return ci_count if scale >= 1 else max(5, round(ci_count * scale))
