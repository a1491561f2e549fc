"""Statistics shared by probes, the trainer and the lab (numpy and torch reductions, no model).

Lives here: ``gates.py`` (Fu et al. 2026's implicit gate, head importance, load imbalance), ``paired.py``
(paired differences with standard errors), ``leak.py`` (the fixed-gap leak model over lengths).
May import: data, models, store, runtime; never probes, forward or anything above.
Add here: a statistic two or more measurements share.
"""
