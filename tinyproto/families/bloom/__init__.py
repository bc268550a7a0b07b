"""Bloom features (Cutkosky & Boahen): seeded hashing, a MAX feature map and a linear classifier. Layer: families."""

from tinyproto.families import HIGHEST, Family, ScoreRule, lazy

FAMILY = Family(name="bloom", title="Bloom features", color="#2ca02c",
                fit_under_budget=lazy("tinyproto.families.bloom.solver:fit_bloom_under_budget"),
                fit_shape=lazy("tinyproto.families.bloom.solver:fit_chosen_bloom"),
                from_json=lazy("tinyproto.families.bloom.quantize:IntBloom.from_json"),
                predict_cycles=lazy("tinyproto.families.bloom.cost:predict_cycles"),
                shape_text=lazy("tinyproto.families.bloom.solver:shape_text"), streamable=True,
                score=ScoreRule(HIGHEST, "a linear score of the input's Bloom features (two classes: 0 for the "
                                         "first, the one score for the second)"),
                static_state=lazy("tinyproto.families.bloom.quantize:IntBloom.static_state"),
                estimator="tinyproto.families.bloom.train:BloomClassifier")
