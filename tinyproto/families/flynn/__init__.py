"""FlyNN / FBFC (Sinha & Ram): a sparse binary lifting, winner-take-all and per-class Bloom filters.
Layer: families."""

from tinyproto.families import Family, lazy


def _shape_text(entry: dict) -> str:
    return (f"m={entry['n_hashes']} s={entry['n_inputs_per_hash']} rho={entry['n_winners']} b={entry['count_bits']} "
            f"c={entry['decay']:g} {'stored' if entry['store_M'] else 'seeded'} M")


FAMILY = Family(name="flynn", title="FlyNN", color="#d62728",
                fit_under_budget=lazy("tinyproto.families.flynn.solver:fit_flynn_under_budget"),
                from_json=lazy("tinyproto.families.flynn.quantize:IntFlyNN.from_json"),
                predict_cycles=lazy("tinyproto.families.flynn.cost:predict_cycles"),
                shape_text=_shape_text, learnable=True)
