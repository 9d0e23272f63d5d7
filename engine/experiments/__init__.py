"""A/B experiments: variants of a funnel, their assignment and their statistics.

- ``engine.format.experiment``: the ``experiment:`` of a funnel file, read and checked
  (F811-F818), part of the format;
- ``router``: which variant a session runs on (``Engine._funnel_for`` asks it);
- ``stats``: Wilson intervals and the two-proportion z-test, in plain Python.

The report by variant is ``engine.report.variants``; docs/experiments.md tells how to
run, read and stop an experiment.

May import: `engine.funnel`, `engine.format` and below; never the store or the turn.
"""

from ..format.experiment import Experiment, Goal, Variant, read_experiment
from .stats import Comparison, compare, normal_two_sided_p, wilson

__all__ = ["Comparison", "Experiment", "Goal", "Variant", "compare", "normal_two_sided_p",
           "read_experiment", "wilson"]
