"""BNC (Zhong et al., AISTATS 2017): binary prototypes and a learned linear hash, 1-NN in Hamming distance.
Layer: families."""

from tinyproto.families import HIGHEST, Family, ScoreRule, lazy


def _shape_text(entry: dict) -> str:
    return str(entry.get("shape", ""))  # the solver writes each candidate row's shape text


FAMILY = Family(name="bnc", title="BNC", color="#9467bd",
                fit_under_budget=lazy("tinyproto.families.bnc.solver:fit_bnc_under_budget"),
                fit_shape=lazy("tinyproto.families.bnc.solver:fit_chosen_bnc"),
                from_json=lazy("tinyproto.families.bnc.quantize:IntBNC.from_json"),
                predict_cycles=lazy("tinyproto.families.bnc.cost:predict_cycles"),
                shape_text=_shape_text, streamable=True,
                score=ScoreRule(HIGHEST, "minus the Hamming distance from the input's code to the class's nearest "
                                         "prototype, so the nearest prototype wins"),
                static_state=lazy("tinyproto.families.bnc.quantize:IntBNC.static_state"),
                estimator="tinyproto.families.bnc.train:BNCClassifier")
