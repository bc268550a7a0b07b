"""ProtoNN (Gupta et al., ICML 2017): a sparse projection, prototypes and an RBF kernel. Layer: families."""

from tinyproto.families import HIGHEST, Family, ScoreRule, lazy


def _shape_text(entry: dict) -> str:
    return f"d_hat={entry['n_components']} m={entry['n_prototypes']} s_W={entry['sparsity_W']:g}"


FAMILY = Family(name="protonn", title="ProtoNN", color="#1f77b4",
                fit_under_budget=lazy("tinyproto.families.protonn.solver:fit_protonn_under_budget"),
                fit_shape=lazy("tinyproto.families.protonn.solver:fit_chosen_protonn"),
                from_json=lazy("tinyproto.families.protonn.quantize:IntProtoNN.from_json"),
                predict_cycles=lazy("tinyproto.families.protonn.cost:predict_cycles"),
                shape_text=_shape_text, streamable=True,
                score=ScoreRule(HIGHEST, "the prototypes' kernel-weighted votes for the class"),
                static_state=lazy("tinyproto.families.protonn.quantize:IntProtoNN.static_state"),
                estimator="tinyproto.families.protonn.train:ProtoNNClassifier")
