"""How device outputs are compared with eager: tolerances, per-step errors, SQNR, masks.

Pure functions of arrays: eager runs (the reference, which elements depend on a buffer's initial value,
what a buffer reads from a heap pattern) are harness/pipeline/eager.py's, made by the caller. numerics
imports nothing of the suite, so a reproduction bundle carries it unchanged; the checks ask a case's
outcome, which computes each of these once and shares it between the state and initial-state checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

# Tolerance per dtype, the one place to read them: |device - eager| <= atol + rtol * |eager|, where
# for quantized dtypes atol is a fraction of the reference's value range (one quantization step of
# 16-bit activations is range/65535; 8-bit is range/255; 4-bit weights add more).
TOLERANCES = {
    "fp16": {"atol": 1e-2, "rtol": 1e-2, "range_fraction": 0.0},
    "16a8w": {"atol": 1e-3, "rtol": 0.0, "range_fraction": 0.02},
    "8a8w": {"atol": 1e-3, "rtol": 0.0, "range_fraction": 0.05},
    "16a4w": {"atol": 1e-3, "rtol": 0.0, "range_fraction": 0.1},
    # LPBQ: 4-bit weights with a scale per block, finer than 16a4w's per-tensor/channel scale: 16a4w's bound holds
    "16a4w_block": {"atol": 1e-3, "rtol": 0.0, "range_fraction": 0.1},
}

Outputs = list[list[np.ndarray]]  # [step][output index], as harness/pipeline/eager.py gives them


@dataclass
class StepError:
    step: int
    max_abs_error: float
    sqnr_db: float
    mismatches: int
    tolerance: float = math.nan  # the error allowed at the element of max_abs_error (the chart's line); NaN: none


@dataclass(frozen=True)
class Comparison:
    """Device vs eager: the numbers per step, and a mismatch mask per output."""

    errors: list[StepError]
    masks: Outputs

    @property
    def mismatched(self) -> bool:
        return any(e.mismatches for e in self.errors)


def tolerance(dtype: str, reference: np.ndarray) -> np.ndarray:
    spec = TOLERANCES[dtype]
    value_range = float(reference.max() - reference.min()) if reference.size else 0.0
    return spec["atol"] + spec["range_fraction"] * value_range + spec["rtol"] * np.abs(reference)


def sqnr_db(reference: np.ndarray, error: np.ndarray) -> float:
    signal, noise = float(np.sum(reference**2)), float(np.sum(error**2))
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def compare(device: Outputs, reference: Outputs, dtype: str) -> Comparison:
    """Per-step error numbers and mismatch masks of device vs eager."""
    errors, masks = [], []
    for step, (got_row, want_row) in enumerate(zip(device, reference)):
        worst, allowed, sqnr, count, row_masks = 0.0, math.nan, math.inf, 0, []
        for got, want in zip(got_row, want_row):
            got64, want64 = got.astype(np.float64), want.astype(np.float64)
            diff = np.abs(got64 - want64)
            allowed_here = np.broadcast_to(tolerance(dtype, want64), diff.shape)
            mask = ~(diff <= allowed_here)  # NaN counts as a mismatch
            row_masks.append(mask)
            if diff.size and not np.isnan(diff).all():  # the allowed error where this output errs most
                peak = int(np.nanargmax(diff))
                if math.isnan(allowed) or float(diff.flat[peak]) > worst:
                    allowed = float(allowed_here.flat[peak])
            worst = max(worst, float(np.nanmax(diff)) if diff.size else 0.0)
            sqnr = min(sqnr, sqnr_db(want64, np.nan_to_num(got64 - want64, nan=1e30)))
            count += int(mask.sum())
        errors.append(StepError(step, worst, sqnr, count, allowed))
        masks.append(row_masks)
    return Comparison(errors, masks)


# QNN's Qnn_DataType_t for fixed-point tensors: (bytes per element, signed)
FIXED_POINT_TYPES = {0x0308: (1, True), 0x0316: (2, True), 0x0408: (1, False), 0x0416: (2, False)}


def pattern_dequantized(
    pattern: int, value: torch.Tensor, stored_bytes: int, data_type: int | None, scale: float | None, offset: int | None
) -> torch.Tensor | None:
    """What a buffer the delegate stores in fixed point reads when its memory holds only the byte `pattern`:
    the stored integer (every byte the pattern) dequantized as QNN does, (q + offset) x scale, in the
    buffer's own dtype. None when the encoding is not a known per-tensor scale and offset."""
    width_signed = FIXED_POINT_TYPES.get(data_type) if data_type is not None else None
    if width_signed is None or scale is None or offset is None or stored_bytes != value.numel() * width_signed[0]:
        return None
    width, signed = width_signed
    stored = int.from_bytes(bytes([pattern]) * width, "little", signed=signed)
    return torch.full(value.shape, (stored + offset) * scale, dtype=torch.float64).to(value.dtype)


def only_where(masks: Outputs, selection: Outputs) -> Outputs:
    return [
        [mask & chosen for mask, chosen in zip(mask_row, chosen_row)] for mask_row, chosen_row in zip(masks, selection)
    ]


def count(masks: Outputs) -> int:
    return int(sum(int(mask.sum()) for row in masks for mask in row))
