"""Reproduction of the experiments of *Differentially Private Quantiles* (Section 5).

Modules: :mod:`~app.experiments.metric` (missed points), :mod:`~app.experiments.datasets`,
:mod:`~app.experiments.runner` (tasks, seeding, process pool), :mod:`~app.experiments.summary`
(tables, paper claims), :mod:`~app.experiments.plots` and :mod:`~app.experiments.cli`
(``dpquant experiments``). Uses :mod:`app.mechanisms` only.
"""
