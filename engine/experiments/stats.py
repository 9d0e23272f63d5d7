"""The statistics of an experiment, in plain Python (no SciPy).

- A rate's 95% confidence interval: the **Wilson score interval**, which stays
  inside [0, 1] and keeps its coverage for small samples and rates near 0 or 1,
  where the Wald interval (p ± z·√(p(1-p)/n)) does not.
- The difference of two rates: the **two-proportion z-test with pooled
  variance**, two-sided: z = (p2 - p1) / √(p̂(1-p̂)(1/n1 + 1/n2)) with
  p̂ = (k1 + k2) / (n1 + n2); p = erfc(|z| / √2), the normal tail on both sides.
  The difference's own 95% interval uses the unpooled standard error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Comparison", "Z95", "compare", "normal_two_sided_p", "wilson"]

Z95 = 1.959963984540054  # the normal quantile of 0.975


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes / n`` (``(0.0, 0.0)`` when ``n`` is 0)."""
    if n <= 0:
        return 0.0, 0.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def normal_two_sided_p(z: float) -> float:
    """P(|Z| >= |z|) for a standard normal Z: ``erfc(|z| / √2)``."""
    return math.erfc(abs(z) / math.sqrt(2))


@dataclass(frozen=True)
class Comparison:
    """A variant against the control: rate difference, its 95% interval, z and p."""

    difference: float  # variant rate - control rate
    low: float
    high: float
    z: float
    p_value: float

    def significant(self, alpha: float = 0.05) -> bool:
        return self.p_value < alpha


def compare(k1: int, n1: int, k2: int, n2: int) -> Comparison | None:
    """Two-sided two-proportion z-test (pooled variance) of ``k2/n2`` against ``k1/n1``.

    Returns ``None`` when a side has no sessions or the pooled rate is 0 or 1 (no
    variance: the test is undefined).
    """
    if n1 <= 0 or n2 <= 0:
        return None
    p1, p2 = k1 / n1, k2 / n2
    pooled = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return None
    z = (p2 - p1) / se
    se_diff = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    diff = p2 - p1
    return Comparison(diff, diff - Z95 * se_diff, diff + Z95 * se_diff, z, normal_two_sided_p(z))
