#!/usr/bin/env python3
"""Regenerate the learnable FlyNN models the learning-firmware fuzz harness is built with (tools/fuzz/models/).

    python tools/fuzz/make_models.py

The models are committed rather than trained on every fuzz run: a crash input only reproduces against the model
it was found with, and CI should not spend seconds training. Each model directory holds the generated
tinyproto_model.h and `cflags`, the learning switches `tinyproto learn` would build it with (the layout key
included, so EEPROM records carry the host's key). Rerun this after a change of the header format or the ABI.

The two models cover the learning code's distinct shapes:
  bc_b3_seeded     breast_cancer, 2 classes, 3-bit counts (fields straddle bytes, saturation), seeded M,
                   sign split (60 hash inputs);
  digits_b1_stored digits, 10 classes, 1-bit counts (the bit-set update), M stored in flash, 128 hash inputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(__file__).resolve().parent / "models"

# name: (data set, bits, m, s, rho, store_M)
SHAPES = {
    "bc_b3_seeded": ("breast_cancer", 3, 203, 8, 16, False),
    "digits_b1_stored": ("digits", 1, 160, 6, 12, True),
}


def make(name: str, data: str, bits: int, m: int, s: int, rho: int, store_m: bool) -> Path:
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.families.flynn.learning import layout_key
    from tinyproto.federated.device_learning import LEARN_FLAGS
    from tinyproto.families.flynn.quantize import IntFlyNN
    from tinyproto.families.flynn.train import FlyNNClassifier
    from tinyproto.core.render import render_header

    sp = split(load_dataset(data))
    # random_state fixed: the same seed of M, hence the same header, on every regeneration
    clf = FlyNNClassifier(n_hashes=m, n_inputs_per_hash=s, n_winners=rho, decay=0.5, random_state=3)
    clf.fit(sp.X_train, sp.y_train)
    model = IntFlyNN.from_classifier(clf, sp.X_train, sp.y_train, bits=bits, store_M=store_m)
    out = MODELS / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "tinyproto_model.h").write_text(render_header(model, data, 0, 4096))
    flags = [*LEARN_FLAGS, f"-DTP_FLYNN_LAYOUT_KEY=0x{layout_key(model):08X}UL"]
    (out / "cflags").write_text("\n".join(flags) + "\n")
    return out


def main() -> int:
    sys.path.insert(0, str(ROOT))
    for name, shape in SHAPES.items():
        print(make(name, *shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
