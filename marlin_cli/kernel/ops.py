"""Typed wrappers of the kernel ops: CUDA tensors run through the bundled kernels, CPU tensors through `reference`.

`gemm` takes the dense Marlin layout, `gemm24` the 2:4 one, its codes and metadata as `prepare24` returns them (on
Hopper GPUs in the kernels' own order). There is no silent fallback on a GPU: if the kernels
cannot be built, both raise KernelUnavailable. `gptq_block` runs GPTQ's column loop (algo/gptq.py) and `clip_scales`
its clipping search of fixed scales (algo/scales.py), together `KERNELS`; the solve keeps its torch loops wherever
`solver_problem` names a reason.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch

from marlin_cli.algo.gptq import PRUNE_M, FixedMask, Kernels, Prune, saliency_prune
from marlin_cli.algo.scales import CLIP_FACTORS, absmax, clip_candidates
from marlin_cli.config import GROUP_SIZES as CONFIG_GROUP_SIZES
from marlin_cli.errors import KernelUnavailable, ShapeError
from marlin_cli.formats import marlin24
from marlin_cli.kernel import build, reference

# Mirrors kernels/marlin.h: two fp32 partial tiles of 64 x 256 per block (both kernels), then two counters per block.
_TILE_ELEMS = 64 * 256
_FLAGS_PER_BLOCK = 2
GROUP_SIZES = tuple(g for g in CONFIG_GROUP_SIZES if g > 0)  # grouped scales; one row means per channel

_lock = threading.Lock()
_workspaces: dict[int, torch.Tensor] = {}
_fake_registered = False
_solver_problems: dict[int, str | None] = {}
_kernel_orders: dict[int, bool] = {}
GPTQ_MAX_COLS = 128  # columns one gptq_block launch holds per row (kernels/gptq.h, kGptqMaxCols)
_PRUNE_NONE, _PRUNE_SALIENCY, _PRUNE_MASK = 0, 1, 2  # kernels/gptq.h, kPrune*
CLIP_MAX_CANDIDATES = 40  # kernels/gptq.h, kClipMaxCandidates
assert len(CLIP_FACTORS) <= CLIP_MAX_CANDIDATES


def kernel_name(device: torch.device) -> str:
    """Which implementation `gemm` uses for tensors on `device`: "cuda" or "reference"."""
    device = torch.device(device)
    if device.type == "cuda" and build.kernel_problem(device) is None:
        return "cuda"
    return "reference"


def _check_a(a: torch.Tensor) -> None:
    m, k = a.shape
    if m < 1:
        raise ShapeError(f"a has {m} rows: the kernel needs at least 1 (skip the call for empty batches)")
    if k % 128:
        raise ShapeError(f"in_features={k} must be a multiple of 128 (Marlin tile); keep this layer unquantized")


def _check_scales(s: torch.Tensor, k: int, n: int) -> None:
    groups = s.shape[0]
    if s.shape[1] != n or groups < 1 or k % groups or (groups > 1 and k // groups not in GROUP_SIZES):
        raise ShapeError(
            f"scales {tuple(s.shape)} do not fit K={k}, N={n}: they must be (K/g, N) with g in {GROUP_SIZES} or a "
            f"single row (per channel); pass the `.s` tensor packed with the layer"
        )


def _check_2d(**tensors: torch.Tensor) -> None:
    if any(t.dim() != 2 for t in tensors.values()):
        shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in tensors.items())
        raise ShapeError(f"{shapes}: all must be 2-D (flatten leading batch dimensions of a into its rows)")


def check_shapes(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor, perm: torch.Tensor | None = None) -> None:
    """Raise ShapeError (value, rule, fix) unless the operands fit the Marlin layout."""
    _check_2d(a=a, b=b, s=s)
    _check_a(a)
    k = a.shape[1]
    n = b.shape[1] // 2
    if b.shape[0] * 16 != k or b.shape[1] % 2:
        raise ShapeError(
            f"b {tuple(b.shape)} does not match a {tuple(a.shape)}: a Marlin weight for K={k} is int32 (K/16, 2N) = "
            f"({k // 16}, 2N); pass the `.B` tensor packed for this layer"
        )
    if n % 64:
        raise ShapeError(f"out_features={n} must be a multiple of 64 (Marlin tile); keep this layer unquantized")
    _check_scales(s, k, n)
    if perm is not None and (perm.dim() != 1 or perm.shape[0] != k):
        raise ShapeError(f"perm {tuple(perm.shape)} must be ({k},), one index per input feature of a")


def check_shapes24(a: torch.Tensor, b24: torch.Tensor, meta: torch.Tensor, s: torch.Tensor) -> None:
    """Raise ShapeError (value, rule, fix) unless the operands fit the 2:4 layout."""
    _check_2d(a=a, b24=b24, meta=meta, s=s)
    _check_a(a)
    k = a.shape[1]
    n = b24.shape[1] // 2
    if b24.shape[0] * 32 != k or b24.shape[1] % 2 or meta.shape != b24.shape:
        raise ShapeError(
            f"b24 {tuple(b24.shape)} and meta {tuple(meta.shape)} do not match a {tuple(a.shape)}: a 2:4 weight for "
            f"K={k} is int32 (K/32, 2N) = ({k // 32}, 2N) with int16 metadata of the same shape; pass the `.B_24` "
            "and `.B_meta` tensors packed for this layer"
        )
    if n % 128:
        raise ShapeError(f"out_features={n} must be a multiple of 128 (2:4 Marlin tile); keep this layer dense")
    _check_scales(s, k, n)


def _check_operands(op: str, typed: dict[str, tuple[torch.Tensor, torch.dtype]]) -> None:
    """Every operand of `op` in its dtype, contiguous, on the CUDA device of the first one. Checked here because a
    bad operand inside the custom op aborts the process instead of raising."""
    first, (ref, _) = next(iter(typed.items()))
    if ref.device.type != "cuda":
        raise ShapeError(f"{op}: {first} is on {ref.device}: the kernel runs on CUDA devices only")
    for name, (t, dtype) in typed.items():
        if t.dtype != dtype:
            raise ShapeError(f"{op}: {name} is {t.dtype}, the kernel takes {dtype}: convert it with .to({dtype})")
        if t.device != ref.device:
            raise ShapeError(f"{op}: {name} is on {t.device} but {first} is on {ref.device}: move every operand there")
        if not t.is_contiguous():
            raise ShapeError(f"{op}: {name} {tuple(t.shape)} is not contiguous: pass {name}.contiguous()")


def _ensure_loaded() -> None:
    global _fake_registered
    build.load_kernel()
    with _lock:
        if not _fake_registered:

            @torch.library.register_fake("marlin_cli::gemm")
            def _gemm_fake(
                a: torch.Tensor, b: torch.Tensor, s: torch.Tensor, perm: torch.Tensor | None, workspace: torch.Tensor
            ) -> torch.Tensor:
                torch._check(a.dim() == 2 and b.dim() == 2, lambda: "marlin_cli::gemm: a and b must be 2-D")
                torch._check(b.shape[0] * 16 == a.shape[1], lambda: "marlin_cli::gemm: b does not match a's K")
                return a.new_empty((a.shape[0], b.shape[1] // 2))

            @torch.library.register_fake("marlin_cli::gemm24")
            def _gemm24_fake(
                a: torch.Tensor, b24: torch.Tensor, meta: torch.Tensor, s: torch.Tensor, workspace: torch.Tensor
            ) -> torch.Tensor:
                torch._check(a.dim() == 2 and b24.dim() == 2, lambda: "marlin_cli::gemm24: a and b24 must be 2-D")
                torch._check(b24.shape[0] * 32 == a.shape[1], lambda: "marlin_cli::gemm24: b24 does not match a's K")
                return a.new_empty((a.shape[0], b24.shape[1] // 2))

            _fake_registered = True


def workspace(device: torch.device) -> torch.Tensor:
    """The int32 workspace of `device`: where the kernels keep the parts of split column strips."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        ws = _workspaces.get(index)
        if ws is None:
            sms = torch.cuda.get_device_properties(index).multi_processor_count
            # two blocks per SM at most: two partial slots and two counters each; the counters start at zero
            ws = torch.zeros(2 * sms * (2 * _TILE_ELEMS + _FLAGS_PER_BLOCK), dtype=torch.int32, device=f"cuda:{index}")
            _workspaces[index] = ws
        return ws


def gemm(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor, perm: torch.Tensor | None = None) -> torch.Tensor:
    """C (M, N) = A[:, perm] @ dequant(B): A (M, K) fp16, B int32 (K/16, 2N) Marlin layout, s fp16 (K/g, N).

    K % 128 == 0, N % 64 == 0, g in {32, 64, 128} or one row of per-channel scales; perm int32 (K,) for act-order.
    CUDA tensors run through the kernel (KernelUnavailable if it cannot be built), CPU tensors through the reference.
    One workspace per device: calls on different streams of one device must not overlap. On Hopper GPUs the kernel may
    read b and s while the previous kernel on the stream still runs, so that kernel must not write them.
    """
    check_shapes(a, b, s, perm)
    if a.device.type != "cuda":
        return reference.gemm(a, b, s, perm)
    typed = {"a": (a, torch.float16), "s": (s, torch.float16), "b": (b, torch.int32)}
    _check_operands("gemm", typed | ({"perm": (perm, torch.int32)} if perm is not None else {}))
    _ensure_loaded()
    return torch.ops.marlin_cli.gemm(a, b, s, perm, workspace(a.device))


class Weights24(NamedTuple):
    """A 2:4 layer's kept codes (`B_24`) and metadata (`B_meta`) as `gemm24` takes them (`prepare24`)."""

    b24: torch.Tensor
    meta: torch.Tensor
    kernel_order: bool  # in formats.marlin24's kernel order (the Hopper kernels'), else as stored


def kernel_order24(device: torch.device | str) -> bool:
    """Whether `gemm24` on `device` reads B_24 and B_meta in formats.marlin24's kernel order (its Hopper kernels)
    rather than as a checkpoint stores them (the mma.sp kernel; the reference on the CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _kernel_orders:
        _ensure_loaded()
        _kernel_orders[index] = bool(torch.ops.marlin_cli.gemm24_kernel_order(index))
    return _kernel_orders[index]


def prepare24(b24: torch.Tensor, meta: torch.Tensor) -> Weights24:
    """A checkpoint's B_24 and B_meta in the order `gemm24` reads them on their device: permuted copies where the
    Hopper kernels run (formats.marlin24.to_kernel_order: they then copy whole tiles into shared memory as they lie,
    perf-log ko1, ko2), the tensors themselves elsewhere. Made once per layer, when it is loaded."""
    if kernel_order24(b24.device):
        return Weights24(*marlin24.to_kernel_order(b24, meta), kernel_order=True)
    return Weights24(b24, meta, kernel_order=False)


def gemm24(a: torch.Tensor, w: Weights24, s: torch.Tensor) -> torch.Tensor:
    """C (M, N) = A @ dequant24(B): A (M, K) fp16, B_24 int32 (K/32, 2N) and B_meta int16 (K/32, 2N) of the 2:4
    layout (formats/marlin24.py) as `prepare24` returns them, s fp16 (K/g, N).

    K % 128 == 0, N % 128 == 0, g in {32, 64, 128} or one row of per-channel scales. CUDA tensors run through the
    2:4 kernel (KernelUnavailable if it cannot be built), CPU tensors through the reference. Shares `gemm`'s
    workspace: calls on different streams of one device must not overlap. As in `gemm`, the kernel launched just
    before must not write the weights or s.
    """
    if not isinstance(w, Weights24):
        raise TypeError("gemm24 takes the layer's codes and metadata as prepare24(b24, meta) returns them")
    b24, meta = w.b24, w.meta
    check_shapes24(a, b24, meta, s)
    if a.device.type != "cuda":
        if w.kernel_order:
            b24, meta = marlin24.from_kernel_order(b24, meta)
        return reference.gemm24(a, b24, meta, s)
    typed = {"a": (a, torch.float16), "s": (s, torch.float16), "b24": (b24, torch.int32), "meta": (meta, torch.int16)}
    _check_operands("gemm24", typed)
    _ensure_loaded()
    if w.kernel_order != kernel_order24(a.device):
        orders = ("the stored order", "the Hopper kernels' order")
        raise ShapeError(
            f"gemm24: the weights are in {orders[w.kernel_order]} but the 2:4 kernel on {a.device} reads "
            f"{orders[not w.kernel_order]}: pass the stored B_24 and B_meta through prepare24 on that device"
        )
    return torch.ops.marlin_cli.gemm24(a, b24, meta, s, workspace(a.device))


def solver_problem(device: torch.device) -> str | None:
    """Why `gptq_block` cannot run on `device` (building the kernels on the first call per device), or None."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"{device} is not a CUDA device"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _solver_problems:
        try:
            with torch.cuda.device(index):
                _ensure_loaded()
            _solver_problems[index] = None
        except KernelUnavailable as exc:
            _solver_problems[index] = str(exc)
    return _solver_problems[index]


def gptq_block(
    w: torch.Tensor,
    u: torch.Tensor,
    scale: torch.Tensor,
    per_column: bool,
    codes: torch.Tensor,
    errors: torch.Tensor,
    e0: int,
    c0: int,
    c1: int,
    c2: int,
    prune: Prune | None = None,
) -> None:
    """GPTQ's loop over columns [c0, c1) of w (N, K) in one launch (kernels/gptq.cu), in place; `prune`:
    algo.gptq.saliency_prune (SparseGPT), an algo.gptq.FixedMask or None.

    u: (K, K) upper Cholesky factor of H^-1; scale: (N, K) per column (`per_column`) or (N,) for all of them;
    writes codes[:, c0:c1] (uint8, N x K), errors[:, c0 - e0 : c1 - e0] and the updated w[:, c1:c2]
    (c2 - c0 <= GPTQ_MAX_COLS). All float32 and contiguous, on one CUDA device: algo.gptq.ColumnLoop.
    """
    _check_2d(w=w, u=u, codes=codes, errors=errors)
    n, k = w.shape
    typed = {"w": (w, torch.float32), "u": (u, torch.float32), "scale": (scale, torch.float32)}
    typed |= {"codes": (codes, torch.uint8), "errors": (errors, torch.float32)}
    keep, mode = None, _PRUNE_NONE
    if prune is saliency_prune:
        mode = _PRUNE_SALIENCY
    elif isinstance(prune, FixedMask):
        keep, mode = prune.keep.view(torch.uint8), _PRUNE_MASK
        typed["keep"] = (keep, torch.uint8)
    elif prune is not None:
        raise ShapeError("gptq_block prunes by saliency_prune or a FixedMask only; run other rules in torch")
    _check_operands("gptq_block", typed)
    if u.shape != (k, k) or codes.shape != (n, k) or errors.shape[0] != n:
        raise ShapeError(f"gptq_block: u {tuple(u.shape)}, codes {tuple(codes.shape)}, errors do not match w {n} x {k}")
    if scale.shape != ((n, k) if per_column else (n,)):
        raise ShapeError(f"gptq_block: scale {tuple(scale.shape)} must be {(n, k) if per_column else (n,)}")
    if not (e0 <= c0 < c1 <= c2 <= k and c2 - c0 <= GPTQ_MAX_COLS and c1 - e0 <= errors.shape[1]):
        raise ShapeError(
            f"gptq_block: column range [{c0}, {c1}, {c2}) with e0={e0} does not fit k={k} (at most "
            f"{GPTQ_MAX_COLS} columns per launch) or errors {tuple(errors.shape)}"
        )
    if keep is not None and keep.shape != (n, k):
        raise ShapeError(f"gptq_block: the fixed mask {tuple(keep.shape)} must be {n} x {k} like w")
    if mode != _PRUNE_NONE and c0 % PRUNE_M:
        raise ShapeError(f"gptq_block: pruning needs runs starting at a multiple of {PRUNE_M}, not {c0}")
    _ensure_loaded()
    s_row, s_col = (k, 1) if per_column else (1, 0)
    torch.ops.marlin_cli.gptq_block(w, u, scale, s_row, s_col, codes, errors, e0, c0, c1, c2, keep, mode)


def clip_scales(w: torch.Tensor, g: int, costs: torch.Tensor | None) -> torch.Tensor:
    """algo.scales.clip_search in one launch (kernels/gptq.cu): (N, K) float32 weights on a CUDA device, groups of g
    columns, per-column error costs (K,) or None -> (N, K / g) scales. The candidates are algo.scales' own; the error
    sums differ from torch's only in their order, so a choice can differ where two candidates' errors tie within
    float32 rounding: algo.scales.ScaleSearch."""
    _check_2d(w=w)
    n, k = w.shape
    typed = {"w": (w, torch.float32)} | ({} if costs is None else {"costs": (costs, torch.float32)})
    _check_operands("clip_scales", typed)
    if g < 1 or k % g:
        raise ShapeError(f"clip_scales: groups of {g} columns do not divide w {n} x {k}")
    if costs is not None and costs.shape != (k,):
        raise ShapeError(f"clip_scales: costs {tuple(costs.shape)} must be ({k},), one per column of w")
    candidates = clip_candidates(absmax(w.view(n, k // g, g), 2)).contiguous()
    scales = torch.empty(n, k // g, dtype=torch.float32, device=w.device)
    _ensure_loaded()
    torch.ops.marlin_cli.clip_scales(w, costs, candidates, scales)
    return scales


KERNELS = Kernels(columns=gptq_block, clip_search=clip_scales)
