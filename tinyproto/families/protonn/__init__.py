"""ProtoNN (Gupta et al., ICML 2017): a sparse projection, prototypes and an RBF kernel. Layer: families."""

from tinyproto.families import Family


def _fit(X, y, budget_bytes, seed, progress=None, max_latency_ms=None, f_cpu_hz=16_000_000):
    from tinyproto.families.protonn.solver import fit_protonn_under_budget

    return fit_protonn_under_budget(X, y, budget_bytes, seed, progress, max_latency_ms, f_cpu_hz)


def _from_json(raw: dict):
    from tinyproto.families.protonn.quantize import IntProtoNN

    return IntProtoNN.from_json(raw)


def _cycles(model) -> dict:
    from tinyproto.families.protonn.cost import predict_cycles

    return predict_cycles(model)


def _shape_text(entry: dict) -> str:
    return f"d_hat={entry['n_components']} m={entry['n_prototypes']} s_W={entry['sparsity_W']:g}"


FAMILY = Family(name="protonn", title="ProtoNN", color="#1f77b4", fit_under_budget=_fit,
                from_json=_from_json, predict_cycles=_cycles, shape_text=_shape_text)
