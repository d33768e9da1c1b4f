"""TAPA attention's validated public wrapper (MATH §4.2): checks, records what ran and calls the
`phaselab::tapa_fwd` custom op (ops.py `tapa_fwd_call`: its body directly where the dispatcher adds
nothing; kernels in tapa/triton_tapa.py and the Gluon ones), differentiable in q, k, v.
The registry's `triton` backend (kernels/attention/function.py) calls `tapa_attention`.

Example:
    >>> out = tapa_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, alpha=0.1, theta=0.5)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from phaselab.kernels.common.checks import check_pos, check_qkv, check_scale, positions
from phaselab.kernels.common.options import DEFAULT_OPTIONS, AttentionOptions, record_options
from phaselab.kernels.common.score_mod import ScoreMod, tapa_split
from phaselab.kernels.registry import record_impl
from phaselab.kernels.tapa import gluon_tapa_bwd, gluon_tapa_host, ops

# The kernels a call can run on (ops.py): forward and backward in `tl`, or both in Gluon (Hopper).
CORES = ("tl", "gluon")


def tapa_attention(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, pos_q_BT: Tensor, pos_k_BS: Tensor,
                   alpha: float = 0.1, theta: float = 0.5, phase_scale: float = 2.0 * math.pi,
                   phase: str = "quadratic", scale: float = 1.0, causal: bool = True,
                   deterministic: bool = True, trivial_pos: bool = False,
                   options: AttentionOptions = DEFAULT_OPTIONS) -> Tensor:
    """Fused TAPA attention (MATH §4.2), differentiable in q, k, v.

    Args:
        q_BHTD: raw queries [B, H, T, D], amplitude part first (D_A = int(theta*D)), D <= 128.
        k_BGSD, v_BGSD: [B, G, S, D], G divides H, q's dtype. pos_*: int64 [B or 1, T | S].
        alpha: exponent on |m - n| (> 0, default 0.1). theta: amplitude fraction (default 0.5;
            1 <= int(theta*D) <= D-1). phase_scale: default 2 pi (the paper; 1.0 = released code).
        phase: "quadratic" (Eq. 12, default) or "linear" (Eq. 16).
        scale: multiplies the score; TAPA's logit is the score itself, so the default is 1.0.
        causal: mask by positions (default True).
        deterministic: True (default) computes dQ in its own kernel, bitwise reproducible; False adds
            it with fp32 atomics inside the dK/dV kernel (one backward kernel; on the GPU the order
            of the additions varies from run to run).
        trivial_pos: the caller guarantees index positions (pos_q == pos_k == 0..T-1, T == S), which
            lets the Gluon Hopper kernels run (`core`).
        options: `AttentionOptions` (tapa_series, exp2, autotune, flash_impl; the model's `attention`
            section).
    Returns:
        out_BHTD [B, H, T, D] in q's dtype; a row that sees no key is 0.
    """
    if not isinstance(options, AttentionOptions):
        raise TypeError(f"options must be an AttentionOptions, got {type(options).__name__}")
    q, k, v = q_BHTD, k_BGSD, v_BGSD
    params, d_amp, scale = validate(q, k, v, pos_q_BT, pos_k_BS, alpha, theta, phase_scale, phase, scale)
    pos_q, pos_k, D = positions(pos_q_BT), positions(pos_k_BS), q.shape[-1]
    run_on = core(q, k, v, trivial_pos, params["theta"], scale, options)
    record_impl("tapa", "fused", deterministic=bool(deterministic) or run_on == "gluon")
    if run_on == "tl":
        record_options("tapa", tapa_series=options.tapa_series, exp2=options.exp2, autotune=options.autotune,
                       core=run_on)
    else:   # the Gluon kernels' optional schedules (gluon_tapa_host.VARIANTS) that ran
        record_options("tapa", core=run_on, variants=sorted(gluon_tapa_host.DEFAULT_VARIANTS[D]))
    out, _lse = ops.tapa_fwd_call(q, k, v, pos_q, pos_k, d_amp, float(params["alpha"]),
                                  float(params["phase_scale"]), params["phase"] == "linear", scale, bool(causal),
                                  bool(deterministic), options.exp2, options.tapa_series, options.autotune, run_on)
    return out


# What `validate`'s checks concluded of earlier calls, by the calls' facts
_VALIDATED: dict = {}
_VALIDATED_MAX = 64


def validate(q: Tensor, k: Tensor, v: Tensor, pos_q: Tensor, pos_k: Tensor, alpha, theta, phase_scale, phase,
             scale) -> tuple:
    """(params, d_amp, scale) of a call after `tapa_attention`'s checks of its tensors (the
    `checks` module's) and scalars (ScoreMod's, MATH §4.2), which raise on bad input. The checks
    depend on nothing but the tensors' types, shapes, dtypes and devices and the scalars' values
    and types, so an eager call whose facts match a validated one's takes that one's result: on
    a CPU machine the checks took 13 us, a kept call 5 (its facts). Under
    torch.compile the checks are traced once and guarded instead (no dict of the host's)."""
    facts = None if torch.compiler.is_compiling() else _facts(q, k, v, pos_q, pos_k, alpha, theta, phase_scale,
                                                              phase, scale)
    done = None if facts is None else _VALIDATED.get(facts)
    if done is not None:
        return done
    q, k, v = check_qkv(q, k, v)
    B, _H, T, D = q.shape
    check_pos("pos_q_BT", pos_q, B, T, q.device)
    check_pos("pos_k_BS", pos_k, B, k.shape[2], q.device)
    params = ScoreMod(kind="tapa", params={"alpha": alpha, "theta": theta, "phase_scale": phase_scale,
                                           "phase": phase}).params
    done = params, tapa_split(D, params["theta"])[0], check_scale(scale)
    if facts is not None:
        if len(_VALIDATED) >= _VALIDATED_MAX:
            _VALIDATED.clear()
        _VALIDATED[facts] = done
    return done


def _facts(*args) -> tuple | None:
    """What `validate`'s checks read of (q, k, v, pos_q, pos_k, *scalars), hashable; None where a
    tensor argument is not one or a scalar is not a plain int, float, str or bool (whose value
    is all its checks read): the checks then run, and say what is wrong."""
    if not all(type(x) in (int, float, str, bool) for x in args[5:]):
        return None
    try:
        facts = (*map(type, args), *(fact for t in args[:5] for fact in (t.shape, t.dtype, t.device)), *args[5:])
        hash(facts)
    except (AttributeError, TypeError):
        return None
    return facts


def core(q: Tensor, k: Tensor, v: Tensor, trivial_pos: bool, theta: float, scale: float,
         options: AttentionOptions) -> str:
    """Which kernels (`CORES`) `tapa_attention` runs: the Gluon ones where `options.flash_impl` allows
    them and they run on these inputs (index positions, sm_90, bf16/fp16, D 64/128 split in halves),
    else "tl"; ValueError with the reason where flash_impl="gluon" asks for them and they cannot."""
    if options.flash_impl == "tl":
        return "tl"
    reason = "positions not declared trivial (trivial_pos)" if not trivial_pos or q.shape[2] != k.shape[2] \
        else gluon_tapa_bwd.supported(q, k, v, theta=theta, scale=scale)   # the forward's conditions too
    if reason is not None:
        if options.flash_impl == "gluon":
            raise ValueError(f"flash_impl='gluon': {reason}")
        return "tl"
    return "gluon"
