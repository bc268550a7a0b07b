"""FlyNN / FBFC (Sinha & Ram): a sparse binary lifting, winner-take-all and per-class Bloom filters.
Layer: families."""

from tinyproto.families import (
    LOWEST,
    Family,
    Learning,
    ScoreRule,
    lazy,
    no_static_state,
)


def _shape_text(entry: dict) -> str:
    return (f"m={entry['n_hashes']} s={entry['n_inputs_per_hash']} rho={entry['n_winners']} b={entry['count_bits']} "
            f"c={entry['decay']:g}{_scale_text(entry)} {'stored' if entry['store_M'] else 'seeded'} M")


def _scale_text(entry: dict) -> str:
    return f" q={entry['count_scale']}" if entry.get("count_scale", 1) != 1 else ""


FAMILY = Family(name="flynn", title="FlyNN", color="#d62728",
                fit_under_budget=lazy("tinyproto.families.flynn.solver:fit_flynn_under_budget"),
                fit_shape=lazy("tinyproto.families.flynn.solver:fit_chosen_flynn"),
                from_json=lazy("tinyproto.families.flynn.quantize:IntFlyNN.from_json"),
                predict_cycles=lazy("tinyproto.families.flynn.cost:predict_cycles"),
                shape_text=_shape_text,
                score=ScoreRule(LOWEST, "the class's novelty: how little its Bloom filter has seen the input's "
                                        "hash winners"),
                static_state=no_static_state,  # tp_predict's heap and sums are on the stack
                learning=Learning(check=lazy("tinyproto.families.flynn.learning:check_learnable"),
                                  host_counts=lazy("tinyproto.families.flynn.learning:host_counts"),
                                  unpack_counts=lazy("tinyproto.families.flynn.learning:unpack_counts"),
                                  host_reference=lazy("tinyproto.families.flynn.learning:host_reference")),
                estimator="tinyproto.families.flynn.train:FlyNNClassifier")
