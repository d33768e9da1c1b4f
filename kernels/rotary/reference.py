"""Reference rotary embedding (RoPE; MATH.md §1). The Triton rotary kernel must match it.

Angles pos * theta_i, their cos/sin and the rotation are computed in fp32 regardless of x's dtype,
then cast back (MATH §7.1; huggingface/transformers#29285, EleutherAI/gpt-neox#1003). Positions
stay int64 until they are multiplied by the fp32 frequency (MATH §7.2).
"""

from __future__ import annotations

import torch
from torch import Tensor

PAIRINGS = ("interleaved", "half")


def _check_positions(pos_BT: Tensor, batch: int, length: int, max_position: int | None) -> None:
    if not isinstance(pos_BT, torch.Tensor):
        raise TypeError(f"pos_BT must be an integer torch.Tensor, got {type(pos_BT).__name__}")
    if pos_BT.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"pos_BT must be int64 (or int32), got {pos_BT.dtype} (MATH §7.2: positions "
                        f"are never held in a floating-point type)")
    if pos_BT.ndim != 2 or pos_BT.shape[0] not in (1, batch) or pos_BT.shape[1] != length:
        raise ValueError(f"pos_BT has shape {tuple(pos_BT.shape)}, expected ({batch} or 1, {length})")
    if max_position is not None and pos_BT.numel() > 0:
        lo, hi = int(pos_BT.min()), int(pos_BT.max())
        if lo < 0 or hi >= max_position:
            raise ValueError(f"positions span [{lo}, {hi}], outside the configured range "
                             f"[0, {max_position}) (max_position={max_position})")


def rotary_angles(pos_BT: Tensor, inv_freq_R2: Tensor) -> Tensor:
    """fp32 angles_BTR2 = pos * theta_i; the int -> float conversion happens here, in fp32."""
    return pos_BT.to(torch.float32)[..., None] * inv_freq_R2.to(torch.float32)


def apply_rotary(x_BTHD: Tensor, pos_BT: Tensor, inv_freq_R2: Tensor, *, pairing: str = "interleaved",
                 conjugate: bool = False, max_position: int | None = None) -> Tensor:
    """Rotate the first R = 2*len(inv_freq) features of every head; the tail is untouched.

    Args:
        x_BTHD: [B, T, H, D] queries or keys (models' layout), any float dtype.
        pos_BT: int64 absolute positions [B or 1, T].
        inv_freq_R2: fp32 frequencies theta_i [R/2] (from `rotary.scaling.rope_frequencies`).
        pairing: "interleaved" pairs (2i, 2i+1) (RoFormer; default), "half" pairs (i, i + R/2)
            (GPT-NeoX / HF LLaMA), MATH §1.3.
        conjugate: rotate by -theta (the inverse rotation, and the backward of the forward one).
        max_position: if given, positions outside [0, max_position) raise ValueError (MATH §1.5).

    Returns: x's dtype and shape; rotation computed in fp32 (float64 for float64 x), tail
        features bit-identical.

    Example:
        >>> q = apply_rotary(q_BTHD, torch.arange(T)[None], default_inv_freq(D, 10_000.0))
    """
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing={pairing!r}: expected one of {PAIRINGS}")
    if x_BTHD.ndim != 4:
        raise ValueError(f"x_BTHD must be 4-D [B, T, H, D], got shape {tuple(x_BTHD.shape)}")
    if inv_freq_R2.ndim != 1 or not inv_freq_R2.is_floating_point():
        raise ValueError(f"inv_freq must be a 1-D float tensor, got shape {tuple(inv_freq_R2.shape)} "
                         f"dtype {inv_freq_R2.dtype}")
    B, T, _, D = x_BTHD.shape
    half = inv_freq_R2.shape[0]
    R = 2 * half
    if R > D:
        raise ValueError(f"2*len(inv_freq)={R} rotated features exceed head_dim D={D}")
    _check_positions(pos_BT, B, T, max_position)
    # fp32 for every input dtype up to fp32 (MATH §7.1); float64 inputs (gradcheck) rotate in
    # float64, still from the fp32 angle.
    dtype = torch.float64 if x_BTHD.dtype == torch.float64 else torch.float32
    angles_BT1R2 = rotary_angles(pos_BT, inv_freq_R2)[:, :, None, :].to(dtype)
    cos, sin = torch.cos(angles_BT1R2), torch.sin(angles_BT1R2)
    if conjugate:
        sin = -sin
    x_rot = x_BTHD[..., :R].to(dtype)
    if pairing == "interleaved":
        a, c = x_rot[..., 0::2], x_rot[..., 1::2]
    else:
        a, c = x_rot[..., :half], x_rot[..., half:]
    ra, rc = a * cos - c * sin, a * sin + c * cos  # R(phi)(a, c), MATH §1.1
    if pairing == "interleaved":
        rotated = torch.stack([ra, rc], dim=-1).flatten(-2)
    else:
        rotated = torch.cat([ra, rc], dim=-1)
    if R == D:
        return rotated.to(x_BTHD.dtype)
    return torch.cat([rotated.to(x_BTHD.dtype), x_BTHD[..., R:]], dim=-1)
