"""BNC (Zhong et al., AISTATS 2017): binary prototypes and a learned linear hash, 1-NN in Hamming distance.
Layer: families."""

from tinyproto.families import Family


def _fit(X, y, budget_bytes, seed, progress=None, max_latency_ms=None, f_cpu_hz=16_000_000):
    from tinyproto.families.bnc.solver import fit_bnc_under_budget

    return fit_bnc_under_budget(X, y, budget_bytes, seed, progress, max_latency_ms, f_cpu_hz)


def _from_json(raw: dict):
    from tinyproto.families.bnc.quantize import IntBNC

    return IntBNC.from_json(raw)


def _cycles(model) -> dict:
    from tinyproto.families.bnc.cost import predict_cycles

    return predict_cycles(model)


def _shape_text(entry: dict) -> str:
    return str(entry.get("shape", ""))  # the solver writes each candidate row's shape text


FAMILY = Family(name="bnc", title="BNC", color="#9467bd", fit_under_budget=_fit,
                from_json=_from_json, predict_cycles=_cycles, shape_text=_shape_text, streamable=True)
