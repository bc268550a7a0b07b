"""ProtoNN in integers: int8 tensors with shared scales, an exp lookup table, and the bit-exact numpy reference.

What the device computes (firmware/tp_protonn.c), step by step, for an int8 input x:

1. projection   p_r  = sum_i Wq[r, i] * x[i]                          int32 (int8 x int8 products)
2. rescale      z_r  = clamp(shift(p_r, PROJ_SHIFT), +-127)           int8; shift rounds half up
3. distance     d_j  = sum_r |z_r - Bq[j, r]|^2                       uint32 (|.| <= 254: one 8-bit mul)
4. kernel       k_j  = TABLE[min(d_j >> TABLE_SHIFT, T - 1)]          uint8, ~ 255 * exp(-gamma^2 * dist)
5. scores       s_l  = sum_j Zq[j, l] * k_j                           int32; label = argmax, ties -> lowest l

Scales: W has its own (max |W| -> 127); B's scale is W's scale x the input step x 2^PROJ_SHIFT, so the
projection is brought to B's grid with one shift instead of a multiply; Z's scale does not matter for argmax.
Only integers reach the device: the float scales stay here for reports.

Input stages (tinyproto.core.inputstage): "feature" stores a mean and gain per kept feature (4 B each); "shared"
stores one offset c and gain g (4 B) and folds the standardisation the model was trained with into W and o:
z = W diag(1/sigma) (x - mu) = W diag(1/(sigma g)) x_q + W diag(1/sigma) (c - mu), so W' = W diag(1/(sigma g))
(quantized) and o = W diag(1/sigma) (c - mu) on B's grid (int16, clamped to +-512: beyond it z saturates
anyway). Trained with "global" scaling (sigma = the data's overall spread) this is the plain shared stage;
with per-feature sigma it is per-feature standardisation at 2 bytes per projected dimension instead of 4 per
feature. W's flash encoding is the smallest exact one (encoding.py); a feature no weight reads is not kept.
Layer: families.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tinyproto.core.carray import CArray
from tinyproto.core.inputstage import INPUT_MAX, InputStage, choose_input_scale, shared_range
from tinyproto.core.ledger import SramItem
from tinyproto.families import IntModelCommon, StaticState
from tinyproto.families.protonn import encoding

# |z_r| bound: B's own range. Projected points essentially never leave it (measured: 0-0.3 % of coordinates on
# digits / breast_cancer / wine, no prediction changed), and int8 z makes each distance term one 8x8 multiply.
PZ_MAX = 127
KERNEL_MAX = 255  # kernel values are uint8
KERNEL_CUTOFF = math.log(2 * KERNEL_MAX)  # exp(-u) * 255 < 0.5 beyond this: the table stops here
DEFAULT_TABLE_SIZE = 64
FOLD_QUANTILE = 0.98  # folded weights: this quantile of |W / sigma| maps to 127
OFFSET_MAX = 512  # |o_r| bound on B's grid: beyond 127 + 385 z saturates whatever the projection
ACC24_MAX_ROW_NNZ = 511  # 24-bit projection accumulators hold rows of up to this many nonzeros (|W x| <= 128^2)
SCORE_GROUP = 5  # classes scored together (TP_PROTONN_SCORE_GROUP): one kernel load serves this many products


def score_layout(Z_q: np.ndarray) -> np.ndarray:
    """Z (m, L) as the device reads it: Z + 128 (uint8, so each product is one unsigned multiply and the score
    is sum - 128 * sum(k)), classes in groups of SCORE_GROUP, each group prototype-major (its G values for
    prototype j together, then j + 1): one kernel value read serves the whole group."""
    Zu = (np.asarray(Z_q, dtype=np.int16) + 128).astype(np.uint8)
    return np.concatenate([Zu[:, g:g + SCORE_GROUP].reshape(-1) for g in range(0, Zu.shape[1], SCORE_GROUP)])


@dataclass(frozen=True)
class IntProtoNN(IntModelCommon):
    classes: list
    input_stage: InputStage
    W_q: np.ndarray  # int8 (D, d), zeros where W is sparse
    B_q: np.ndarray  # int8 (m, D): one row per prototype
    Z_q: np.ndarray  # int8 (m, L): one row per prototype
    proj_shift: int  # > 0: round-shift right, < 0: shift left
    table: np.ndarray  # uint8 (T,)
    table_shift: int
    scales: dict  # float scales, for reports only: input, W, B, Z, gamma
    offset: np.ndarray | None = None  # int16 (D,) on B's grid, with a shared input stage; None: no offset

    family = "protonn"  # the registry name (tinyproto.families)
    family_id = 1  # TP_FAMILY_ID

    # ---- shape -------------------------------------------------------------------------------------
    @property
    def n_features(self) -> int:
        return int(self.W_q.shape[1])

    @property
    def n_classes(self) -> int:
        return int(self.Z_q.shape[1])

    @property
    def n_components(self) -> int:
        return int(self.W_q.shape[0])

    @property
    def n_prototypes(self) -> int:
        return int(self.B_q.shape[0])

    @property
    def w_encoding(self) -> str:
        """W's flash encoding: the smallest exact one (encoding.py), ties to the faster."""
        return encoding.smallest(self.W_q)

    @property
    def streamable(self) -> bool:
        """The device app streams this model's inputs (TP_STREAMABLE 1): W is stored feature by feature."""
        return self.w_encoding in ("col_bytes", "col_nibbles")

    @property
    def w_dense(self) -> bool:
        return self.w_encoding == "dense"

    @property
    def max_row_nnz(self) -> int:
        return int(np.count_nonzero(self.W_q, axis=1).max()) if self.W_q.size else 0

    # ---- the deployed arrays -------------------------------------------------------------------------
    def carrays(self) -> list[CArray]:
        arrays = self.input_stage.carrays()
        name = self.w_encoding
        flash = encoding.encode(self.W_q, name)
        if name == "dense":
            arrays.append(CArray("protonn_W", "int8_t", encoding.dense_layout(self.W_q),
                                 f"projection W, dense int8, rows in groups of {encoding.DENSE_GROUP} input by input"))
        elif name == "bitmap":
            arrays.append(CArray("protonn_W_bitmap", "uint8_t", encoding.bitmap_stream(self.W_q),
                                 "projection W, row by row: per 8 inputs a nonzero bitmap byte, then those nonzeros"))
        else:
            what = "1 byte" if name == "col_bytes" else "4 bits"
            arrays.append(CArray("protonn_W_codes", "uint8_t", flash["codes"],
                                 f"projection W, {what} per nonzero: row | last-of-feature flag, feature by feature"))
            arrays.append(CArray("protonn_W_values", "int8_t", flash["values"],
                                 "projection W, nonzeros feature by feature"))
        if self.offset is not None:
            arrays.append(CArray("protonn_offset", "int16_t", self.offset,
                                 "projection offset on B's grid (the folded input standardisation)"))
        arrays.append(CArray("protonn_B", "int8_t", self.B_q, "prototypes B, int8 (m x D)"))
        arrays.append(CArray("protonn_Z", "uint8_t", score_layout(self.Z_q),
                             f"prototype labels Z + 128, uint8, classes in groups of {SCORE_GROUP} (m x group)"))
        arrays.append(CArray("protonn_kernel", "uint8_t", self.table, "exp(-gamma^2 dist) lookup table"))
        return arrays

    def defines(self) -> dict[str, int]:
        name = self.w_encoding
        out = {
            **self.input_stage.defines(),
            "TP_PROTONN_DIM": self.n_components,
            "TP_PROTONN_PROTOS": self.n_prototypes,
            "TP_PROTONN_W_DENSE": int(name == "dense"),
            "TP_PROTONN_W_MASK_BYTES": encoding.mask_row_bytes(self.n_features),
            "TP_PROTONN_PROJ_RSHIFT": max(self.proj_shift, 0),
            "TP_PROTONN_PROJ_LSHIFT": max(-self.proj_shift, 0),
            "TP_PROTONN_PZ_MAX": PZ_MAX,
            "TP_PROTONN_TABLE_SIZE": int(self.table.size),
            "TP_PROTONN_TABLE_SHIFT": self.table_shift,
        }
        # Only what differs from the C defaults (row-major W, no offset, not streamed) is written, so a model
        # without the wide-input features keeps its header, and its hash, byte for byte.
        if self.streamable:
            # column-coded W streams (the device app feeds each chunk as it arrives, no input vector held);
            # a row-major W (narrow inputs) is gathered (d bytes) and runs tp_predict's assembly row kernels
            out.update(TP_STREAMABLE=1, TP_PROTONN_W_ENC=encoding.ENCODING_ID[name],
                       TP_PROTONN_ACC24=int(self.max_row_nnz <= ACC24_MAX_ROW_NNZ))
        if self.offset is not None:
            out["TP_PROTONN_OFFSET"] = 1
        return out

    def working_sram(self) -> list[SramItem]:
        return [
            SramItem("input", self.n_features, "int8 input vector (the device app's buffer unless streamed)"),
            SramItem("projection", self.n_components, "int8 projected vector z"),
            SramItem("kernels", self.n_prototypes, "uint8 kernel value per prototype"),
            SramItem("scores", 4 * self.n_classes, "int32 score per class"),
            *self.static_state().items,
        ]

    def static_state(self) -> StaticState:
        """firmware/tp_protonn.c's static variables for this model (AVR: 2-byte pointers). The streaming trio keeps
        D projection sums (24 bits each when TP_PROTONN_ACC24) and its read positions in W; a column-coded W
        (TP_STREAMABLE) runs tp_predict through that stream, so only then does tp_predict use them."""
        enc = self.w_encoding
        acc24 = self.streamable and self.max_row_nnz <= ACC24_MAX_ROW_NNZ
        items = [SramItem("pn_acc", (3 if acc24 else 4) * self.n_components,
                          f"{self.n_components} projection sums of the stream (static)")]
        if enc == "bitmap":
            items.append(SramItem("pn_cursor", 2 * self.n_components, "per row: its read position in W (static)"))
        elif enc in ("col_bytes", "col_nibbles"):
            items.append(SramItem("pn_read", 4 + (enc == "col_nibbles"), "the stream's read position in W (static)"))
        return StaticState(predict=tuple(items)) if self.streamable else StaticState(stream_only=tuple(items))

    def score_bound(self) -> int:
        """No score leaves the range its prototype labels allow: every kernel value is a table entry (0..255), so a
        class's score lies between its negative labels' sum and its positive labels' sum, times the largest entry."""
        Z = self.Z_q.astype(np.int64)
        largest = int(np.max(self.table))
        return largest * int(max(np.clip(Z, 0, None).sum(axis=0).max(), (-np.clip(Z, None, 0)).sum(axis=0).max()))

    def multiply_accumulates(self) -> int:
        """MACs per inference: projection nonzeros + prototype distances + score accumulation."""
        return int(np.count_nonzero(self.W_q)) + self.B_q.size + self.Z_q.size

    # ---- the bit-exact reference --------------------------------------------------------------------
    def projections(self, xq: np.ndarray) -> np.ndarray:
        """Steps 1-2: int8 projected vectors z (n, D), held as int64."""
        p = np.asarray(xq, dtype=np.int64) @ self.W_q.T.astype(np.int64)
        if self.proj_shift > 0:
            z = (p + (1 << (self.proj_shift - 1))) >> self.proj_shift
        else:
            z = np.clip(p, -32767, 32767) << (-self.proj_shift)  # as the C code: no overflow, same saturation
        if self.offset is not None:
            z = z + self.offset.astype(np.int64)[None, :]
        return np.clip(z, -PZ_MAX, PZ_MAX)

    def kernels(self, xq: np.ndarray) -> np.ndarray:
        """Steps 3-4: uint8 kernel value of every prototype (n, m)."""
        z = self.projections(xq)
        diff = z[:, None, :] - self.B_q.astype(np.int64)[None, :, :]
        dist = np.einsum("nmd,nmd->nm", diff, diff)
        index = np.minimum(dist >> self.table_shift, self.table.size - 1)
        return self.table[index].astype(np.int64)

    def scores(self, xq: np.ndarray) -> np.ndarray:
        """Step 5: the int32 score vectors the C code returns, as int64 (n, L)."""
        return self.kernels(xq) @ self.Z_q.astype(np.int64)

    @staticmethod
    def labels(scores: np.ndarray) -> np.ndarray:
        return np.argmax(scores, axis=1)  # numpy returns the first maximum: lowest class index wins ties

    def predict(self, X_raw: np.ndarray) -> np.ndarray:
        """Original class labels for raw features, through the whole integer pipeline."""
        xq = self.input_stage.quantize(X_raw)
        return np.asarray(self.classes)[self.labels(self.scores(xq))]

    # ---- artefact ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            **self.json_head(),
            "W_q": self.W_q.tolist(),
            "B_q": self.B_q.tolist(),
            "Z_q": self.Z_q.tolist(),
            "proj_shift": self.proj_shift,
            "table": self.table.tolist(),
            "table_shift": self.table_shift,
            "scales": self.scales,
            **({"offset": self.offset.tolist()} if self.offset is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: dict) -> "IntProtoNN":
        model = cls._from_json_fields(raw)
        _check_shapes(model)
        return model

    @classmethod
    def _from_json_fields(cls, raw: dict) -> "IntProtoNN":
        return cls(
            **cls.head_from_json(raw),
            W_q=np.asarray(raw["W_q"], dtype=np.int8),
            B_q=np.asarray(raw["B_q"], dtype=np.int8),
            Z_q=np.asarray(raw["Z_q"], dtype=np.int8),
            proj_shift=int(raw["proj_shift"]),
            table=np.asarray(raw["table"], dtype=np.uint8),
            table_shift=int(raw["table_shift"]),
            scales=dict(raw["scales"]),
            offset=np.asarray(raw["offset"], dtype=np.int16) if raw.get("offset") is not None else None,
        )


def _check_shapes(model: "IntProtoNN") -> None:
    """W (d^, d), B (m, d^), Z (m, L), offset (d^,), a 1-D table: the C code indexes each by the others' sizes,
    so a model.json whose arrays disagree (an edited one) is refused instead of read out of bounds on the device."""
    W, B, Z, table, offset = model.W_q, model.B_q, model.Z_q, model.table, model.offset
    agree = (W.ndim == 2 and B.ndim == 2 and Z.ndim == 2 and table.ndim == 1 and B.shape[1] == W.shape[0]
             and Z.shape[0] == B.shape[0] and min(W.shape + B.shape + Z.shape + table.shape) > 0
             and (offset is None or offset.shape == (W.shape[0],)))
    if not agree:
        shapes = f"W {W.shape}, B {B.shape}, Z {Z.shape}, table {table.shape}"
        raise ValueError(f"array shapes disagree: {shapes}" + ("" if offset is None else f", offset {offset.shape}"))


def _symmetric_int8(values: np.ndarray, quantile: float = 1.0) -> tuple[np.ndarray, float]:
    """int8 with one shared scale: the largest magnitude (or that quantile of the nonzero magnitudes) maps to 127."""
    magnitudes = np.abs(values[values != 0]) if quantile < 1.0 else np.abs(values)
    largest = float(np.quantile(magnitudes, quantile)) if magnitudes.size else 0.0
    scale = largest / 127.0 if largest > 0 else 1.0
    return np.clip(np.rint(values / scale), -127, 127).astype(np.int8), scale


def kernel_table(gamma: float, b_scale: float, size: int) -> tuple[np.ndarray, int]:
    """uint8 table of 255 * exp(-gamma^2 * b_scale^2 * dist), indexed by dist >> shift.

    The shift is the smallest that lets `size` bins reach the cutoff where the kernel rounds to 0; each entry
    is the kernel at the centre of its bin, and the last bin also covers everything beyond.
    """
    per_unit = (gamma * b_scale) ** 2  # exp argument per integer distance unit
    reach = KERNEL_CUTOFF / per_unit if per_unit > 0 else float(size)
    shift = max(0, math.ceil(math.log2(max(reach / size, 1.0))))
    width = 1 << shift
    centres = np.arange(size) * width + (width - 1) / 2.0
    table = np.rint(KERNEL_MAX * np.exp(-per_unit * centres))
    return table.astype(np.uint8), shift


def quantize_protonn(clf, X_train: np.ndarray, table_size: int = DEFAULT_TABLE_SIZE,
                     stage: str = "feature") -> IntProtoNN:
    """Turn a fitted ProtoNNClassifier into the integer model (scales chosen from the training data).

    stage "feature": the device standardises each kept feature; "shared": one offset and gain on the device,
    the classifier's standardisation folded into W and the projection offset (see the module docstring)."""
    n_inputs = int(np.asarray(X_train).shape[1])
    if stage == "shared":
        offset_c, gain_g = shared_range(X_train)
        device = InputStage.shared(offset_c, gain_g, n_inputs)
        c, g = float(device.mean[0]), float(device.gain[0])  # the values the device really uses
        w_over_sigma = clf.W_ / clf.scale_[None, :]
        # Per-feature 1/sigma spreads the folded weights over decades (a nearly constant pixel has a tiny sigma);
        # the largest would leave most weights at 0, so a high quantile of the nonzeros sets the int8 scale and
        # the few above it saturate at +-127.
        W_q, w_scale = _symmetric_int8(w_over_sigma / g, FOLD_QUANTILE)
        proj_unit = w_scale
        input_scale = 1.0 / g
    else:
        input_scale = choose_input_scale(clf.standardize(X_train))
        W_q, w_scale = _symmetric_int8(clf.W_)
        proj_unit = w_scale * input_scale  # real value of one unit of the int32 projection
    b_largest = float(np.max(np.abs(clf.B_))) or 1.0
    proj_shift = math.ceil(math.log2(b_largest / (INPUT_MAX * proj_unit)))
    offset = None
    if stage == "shared":
        proj_shift = max(proj_shift, -15)  # the C code's left shift works on |p| <= 32767 (int32 stays exact)
    b_scale = proj_unit * 2.0**proj_shift
    if stage == "shared":
        # o = W diag(1/sigma) (c - mu) from the quantized weights, so the integer model is self-consistent
        o = (W_q.astype(np.float64) * (w_scale * g)) @ (c - clf.mean_)
        offset = np.clip(np.rint(o / b_scale), -OFFSET_MAX, OFFSET_MAX).astype(np.int16)
    used = (W_q != 0).any(axis=0)
    if not used.any():
        used[0] = True
    W_q = np.ascontiguousarray(W_q[:, used])
    if stage == "shared":
        device = device.keep_only(used)
    else:
        kept = None if used.all() else np.flatnonzero(used)
        device = InputStage.from_standardisation(clf.mean_[used], clf.scale_[used], input_scale, kept=kept,
                                                 n_inputs=n_inputs if kept is not None else None)
    B_q = np.clip(np.rint(clf.B_.T / b_scale), -127, 127).astype(np.int8)
    Z_q, z_scale = _symmetric_int8(clf.Z_.T)
    table, table_shift = kernel_table(clf.gamma_, b_scale, table_size)
    return IntProtoNN(
        classes=[_json_label(c) for c in clf.classes_],
        input_stage=device,
        W_q=W_q,
        B_q=B_q,
        Z_q=Z_q,
        proj_shift=proj_shift,
        table=table,
        table_shift=table_shift,
        scales={"input": input_scale, "W": w_scale, "B": b_scale, "Z": z_scale, "gamma": float(clf.gamma_)},
        offset=offset,
    )


def drop_unread(model: IntProtoNN) -> IntProtoNN:
    """The same model without the features no weight reads (after nonzeros were dropped): they store nothing
    and are never sent. Scores are unchanged: those columns contributed 0 to every projection."""
    used = (model.W_q != 0).any(axis=0)
    if used.all() or not used.any():
        return model
    return replace(model, W_q=np.ascontiguousarray(model.W_q[:, used]),
                   input_stage=model.input_stage.keep_only(used))


def _json_label(label):
    """numpy scalars -> plain Python, so labels survive JSON unchanged."""
    return label.item() if hasattr(label, "item") else label
