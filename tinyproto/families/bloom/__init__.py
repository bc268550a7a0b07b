"""Bloom features (Cutkosky & Boahen): seeded hashing, a MAX feature map and a linear classifier. Layer: families."""

from tinyproto.families import Family, lazy

FAMILY = Family(name="bloom", title="Bloom features", color="#2ca02c",
                fit_under_budget=lazy("tinyproto.families.bloom.solver:fit_bloom_under_budget"),
                from_json=lazy("tinyproto.families.bloom.quantize:IntBloom.from_json"),
                predict_cycles=lazy("tinyproto.families.bloom.cost:predict_cycles"),
                shape_text=lazy("tinyproto.families.bloom.solver:shape_text"), streamable=True)
