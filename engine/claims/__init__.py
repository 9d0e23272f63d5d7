"""Claims in the reply, checked in code: prices, discounts, products and promises.

The words a customer reads are the model's; what they claim is checked against
the catalog and the session's state before the customer sees them:

- ``text``: a reply cut into sentences and words, folded (NFKC, case, apostrophes);
- ``lexicon``: currencies, product words, discount words and the built-in promises
  in uk, ru, en and pl;
- ``money``: money amounts and percentages in a sentence;
- ``products``: the catalog's names, keys and SKUs, and names it does not have;
- ``check``: :class:`ClaimChecker`, built once per funnel, and its :class:`Refusal`.

May import: `engine.format`, `engine.sandbox` (conditions, RE2) and below.
"""

from .check import ClaimChecker, Refusal, problem

__all__ = ["ClaimChecker", "Refusal", "problem"]
