"""Bloom features (Cutkosky & Boahen): seeded hashing, a MAX feature map and a linear classifier. Layer: families."""

from tinyproto.families import Family


def _fit(X, y, budget_bytes, seed, progress=None, max_latency_ms=None, f_cpu_hz=16_000_000):
    from tinyproto.families.bloom.solver import fit_bloom_under_budget

    return fit_bloom_under_budget(X, y, budget_bytes, seed, progress, max_latency_ms, f_cpu_hz)


def _from_json(raw: dict):
    from tinyproto.families.bloom.quantize import IntBloom

    return IntBloom.from_json(raw)


def _cycles(model) -> dict:
    from tinyproto.families.bloom.cost import predict_cycles

    return predict_cycles(model)


def _shape_text(entry: dict) -> str:
    from tinyproto.families.bloom.solver import shape_text

    return shape_text(entry)


FAMILY = Family(name="bloom", title="Bloom features", color="#2ca02c", fit_under_budget=_fit,
                from_json=_from_json, predict_cycles=_cycles, shape_text=_shape_text, streamable=True)
