"""What several tests share, one module per theme (tests never import each other; none of these registers a test):

* ``seeding``: per-instance seeded generators;
* ``applies``: why a family of tests does not apply to a model, and which layers a test reads;
* ``passes``: attention-only reruns (a prepared batch, its base pass, the decision's rows, cache rows);
* ``measures``: means over heads and real query rows, JSD per layer, weighted means, Spearman ρ;
* ``rows``: the identifying columns of per-instance rows and the attention heatmap rows;
* ``plots``: figures drawn the same way by several tests;
* ``published``: the tagging study's published figures and ``compare`` (two models' attention and outputs);
* ``units``: a rationale's scoring units (words of wordpieces).

What the tests reuse beyond these lives below them (the adversary sub-runs in
:mod:`attnaudit.training.attention_adversaries`, the metrics in :mod:`attnaudit.algorithms`).
"""
