"""What the Gluon Hopper kernels (gluon_hopper.py, gluon_hopper_bwd.py, and TAPA's on them) share:
on the host Gluon's Hopper API or why it is missing, the head dims and dtypes they take, the
routing check and the TMA descriptors; in the kernels the register layouts and a head's K/V row.

The module imports without Gluon (CPU machines, other Triton versions): `IMPORT_ERROR` says why,
`supported` turns it into a routing reason, and nothing Gluon runs under TRITON_INTERPRET.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

from phaselab.kernels.common.checks import capability

try:  # Gluon's Hopper API as of Triton 3.6 (it moves between releases)
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.driver import driver

    IMPORT_ERROR = None
except Exception as exc:  # noqa: BLE001 - any failure means "no Gluon kernels here"
    IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

__all__ = ["DTYPES", "HEAD_DIMS", "IMPORT_ERROR", "PRODUCER_REGS", "Address", "TensorDescriptor", "descriptor",
           "descriptor_at",
           "fence_async_shared", "gl", "gl_dtype", "gluon", "kv_base_row", "launch", "mbarrier", "mma_layout",
           "rows_layout", "supported", "tma", "triton", "warpgroup_mma", "warpgroup_mma_wait"]

HEAD_DIMS = (64, 128)
DTYPES = (torch.bfloat16, torch.float16)
PRODUCER_REGS = 24  # a warp-specialised kernel's producer warp only issues TMA (FA3 gives it 24-32)


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos_q=None, pos_k=None, *,
              what: str = "a Gluon kernel") -> str | None:
    """None when a Gluon kernel can run on these inputs, else a short reason (for routing logs).
    What the inputs say is checked before the machine, so the reasons read the same everywhere."""
    if pos_q is not None or pos_k is not None:
        return f"explicit positions ({what} is index-causal)"
    if not all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in (q, k, v)):
        return "q, k, v must be 4-D tensors"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype} (needs bf16 or fp16, one for q, k, v)"
    if q.shape[-1] not in HEAD_DIMS or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        return f"head dims q {q.shape[-1]}, k {k.shape[-1]}, v {v.shape[-1]} (needs one of {HEAD_DIMS})"
    B, H, T, _ = q.shape
    if k.shape[:3] != v.shape[:3] or k.shape[0] != B or k.shape[1] == 0 or H % k.shape[1] or T == 0 or k.shape[2] == 0:
        return f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} (need [B,H,T,D], [B,G,S,D], G | H)"
    if IMPORT_ERROR is not None:
        return f"gluon unavailable ({IMPORT_ERROR[:80]})"
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "TRITON_INTERPRET is set (Gluon does not run in the interpreter)"
    if q.device.type != "cuda" or k.device != q.device or v.device != q.device:
        return f"device {q.device} (needs CUDA, one device)"
    if capability(q.device.index) != (9, 0):
        return f"capability {capability(q.device.index)} (needs sm_90)"
    return None


def gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]


@functools.lru_cache(maxsize=32)
def block_layout(rows: int, D: int, dtype: torch.dtype):
    """The NVMMA shared layout of a [rows, D] block, built once per shape and dtype: it is frozen,
    and building it took the host more than the rest of a descriptor (TAPA's forward builds 5, its
    backward 12)."""
    return gl.NVMMASharedLayout.get_default_for([rows, D], gl_dtype(dtype))


def _field_defaults() -> dict | None:
    """The defaults of Triton's host TensorDescriptor fields past (base, shape, strides, block_shape,
    layout), where every one has a default and padding's is "zero"; else None. Where they are
    known, `descriptor_at` sets the fields without the class's __post_init__, which only asserts
    what `descriptor_at` checks itself for the blocks the kernels use (alignment, a power-of-two block
    of 16-256, the dtype, the swizzle's width): the constructor took 1.7 us a descriptor on a CPU
    machine, fields set directly 0.4."""
    if IMPORT_ERROR is not None:
        return None
    fields = dataclasses.fields(TensorDescriptor)
    rest = {f.name: f.default for f in fields[5:]}
    if [f.name for f in fields[:5]] != ["base", "shape", "strides", "block_shape", "layout"] \
            or dataclasses.MISSING in rest.values() or rest.get("padding") != "zero":
        return None
    return rest


_DEFAULTS = _field_defaults()
_BLOCK_SIDES = frozenset((16, 32, 64, 128, 256))


class Address:
    """A descriptor's base as a launch reads it: an address and a dtype, holding no tensor. Triton
    specialises a Gluon descriptor on its base's dtype (with its block and layout) and its launcher
    reads the base's `data_ptr()` alone, so a descriptor on an Address launches as one on the
    tensor at that address does, and `descriptor_at` can keep descriptors without keeping their
    tensors' memory alive."""

    __slots__ = ("dtype", "ptr")

    def __init__(self, ptr: int, dtype: torch.dtype):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr

    def __eq__(self, other) -> bool:
        return isinstance(other, Address) and (self.ptr, self.dtype) == (other.ptr, other.dtype)

    def __hash__(self) -> int:
        return hash((self.ptr, self.dtype))


def descriptor(t: torch.Tensor, rows: int, width: int | None = None) -> TensorDescriptor:
    """TMA descriptor of t [..., L, D] (rows dense: contiguous, or the leading `width` columns of a
    contiguous tensor's view) as a [rows_total, width] matrix of row stride D' (t's row stride),
    blocks of `rows` rows and the whole width (default D): `descriptor_at` t's address."""
    return descriptor_at(t.data_ptr(), t.dtype, t.numel() // t.shape[-1], t.shape[-1] if width is None else width,
                         t.stride(-2), rows)


@functools.lru_cache(maxsize=512)
def descriptor_at(ptr: int, dtype: torch.dtype, rows_total: int, width: int, row_stride: int,
                  rows: int) -> TensorDescriptor:
    """TMA descriptor of the [rows_total, width] matrix of row stride `row_stride` elements at
    address ptr, blocks of `rows` rows and the whole width, on an `Address` (a pure function of
    its arguments, so kept: a launch that meets the same tensors again, as the caching allocator
    hands them out, finds its descriptors built; on a CPU machine `descriptor` took 1.2 us with
    the descriptor kept, 1.7 building it, and TAPA's five by address 2.4 against 22.7 through
    views of the halves). Its fields are set directly where `_DEFAULTS` allows and the checks below hold,
    else through the constructor, which refuses what it cannot take."""
    base, shape, strides, block = Address(ptr, dtype), [rows_total, width], [row_stride, 1], [rows, width]
    layout = block_layout(rows, width, dtype)
    if _DEFAULTS is None or rows not in _BLOCK_SIDES or width not in _BLOCK_SIDES or dtype not in DTYPES \
            or ptr % 16 or row_stride * dtype.itemsize % 16 or width * dtype.itemsize < layout.swizzle_byte_width:
        return TensorDescriptor(base, shape, strides, block, layout)
    desc = object.__new__(TensorDescriptor)
    desc.__dict__.update(_DEFAULTS, base=base, shape=shape, strides=strides, block_shape=block, layout=layout)
    return desc


if IMPORT_ERROR is None:

    @gluon.constexpr_function
    def mma_layout(num_warps, n):
        """wgmma accumulator layout: warps stacked along M (16 rows each), instruction n wide."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])

    @gluon.jit
    def kv_base_row(i_bh, H, GROUP, S):
        """The first row of query head i_bh's K and V in their [B*G*S, D] views: GQA's kv head
        h // (H // G) of batch i_bh // H (GROUP = H // G query heads a kv head)."""
        return (i_bh // H * (H // GROUP) + i_bh % H // GROUP) * S

    @gluon.constexpr_function
    def rows_layout(num_warps, d):
        """16-byte vectors along the head dim, for global loads and stores of [rows, d] tiles."""
        cols = min(32, d // 8)
        return gl.BlockedLayout([1, 8], [32 // cols, cols], [num_warps, 1], [1, 0])


# Compiled kernels of earlier launches (`launch`), keyed by everything Triton specialises a launch on
_LAUNCHES: dict = {}
_LAUNCHES_MAX = 256


def _launch_fact(x):
    """What of one kernel argument a compiled kernel may depend on: a superset of Triton's
    specialisation (integers by value, tensors by dtype and 16-byte alignment, descriptors by
    dtype, shape, strides, block and layout; floats pass as fp32 and are never specialised)."""
    if isinstance(x, int):   # bool too: the type tells them apart
        return type(x), x
    if isinstance(x, float):
        return float
    if isinstance(x, torch.Tensor):
        return x.dtype, x.data_ptr() % 16 == 0
    if isinstance(x, TensorDescriptor):
        return (x.base.dtype, tuple(x.shape), tuple(x.strides), tuple(x.block_shape), x.layout, x.padding,
                x.base.data_ptr() % 16 == 0)
    raise TypeError(f"no launch key for a {type(x).__name__}")


def launch(kernel, grid: tuple, *args, key=None, **meta) -> None:
    """kernel[grid](*args, **meta): the non-constexpr arguments positional, the constexprs (which
    follow them in the kernel's signature) and options as keywords. A launch whose kernel,
    device, keywords and arguments' `_launch_fact`s match an earlier one's runs that one's compiled
    kernel through its launcher directly, skipping Triton's per-call binding and cache-key work
    (JITFunction.run: 62 -> 41 us a launch on an H100 machine); the first launch of each goes
    through Triton, and so does any launch this cannot key. key: a hashable the caller derives
    from what fixes every argument's `_launch_fact` (shapes, dtypes, alignments), used in their
    place: the key from the facts of TAPA's forward's 24 arguments took 12.5 us on a CPU machine."""
    device = torch.cuda.current_device()
    try:
        key = (kernel, device, tuple(meta.items()), tuple(map(_launch_fact, args)) if key is None else key)
        hit = _LAUNCHES.get(key)
    except TypeError:   # an argument this cannot key, or an unhashable fact
        kernel[grid](*args, **meta)
        return
    if hit is None:
        compiled = kernel[grid](*args, **meta)
        if compiled is None:
            return
        bound, _, _ = kernel.device_caches[device][4](*args, **meta)   # Triton's binder: the constexprs' values
        if len(_LAUNCHES) >= _LAUNCHES_MAX:
            _LAUNCHES.clear()
        _LAUNCHES[key] = (compiled, tuple(bound.values())[len(args):])
        return
    compiled, constexprs = hit
    values = (*args, *constexprs)
    stream = driver.active.get_current_stream(device)
    hooks = triton.knobs.runtime
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                 compiled.function, compiled.packed_metadata, compiled.launch_metadata(grid, stream, *values),
                 hooks.launch_enter_hook, hooks.launch_exit_hook, *values)
