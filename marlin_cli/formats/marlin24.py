"""The Sparse-MARLIN 2:4 layout (DESIGN.md 3.2): pure, bit-exact pack and unpack.

W is handled as (K, N) = Linear.weight.T with 4-bit codes 0..15 (code 8 is the value 0). Of every 4 consecutive rows
along K at most 2 codes differ from 8; exactly 2 positions per group of 4 are stored:
- `B_24` int32 (K/32, 2N): the kept codes as a (K/2, N) matrix, tiled like the dense layout (16x16 tiles, 16x64
  strips) but with the 2:4 strip permutation, 8 codes per int32.
- `B_meta` int16 (K/32, 2N): per group of 4 the nibble idx0 | idx1 << 2 of the kept positions (idx0 < idx1), 4 nibbles
  per int16 along K, arranged as the sparse tensor-core instruction reads them (`meta_perm`).
- `s` fp16 (G, N): group scales with their columns permuted within 64 (per channel: unpermuted).

How the kernel reads it (kernels/marlin24_kernel.cuh), which is what fixes the two permutations: the weights are the
sparse operand A of mma.sp.m16n8k32 (rows = output columns n, 32 along K), the activations its operand B.
"""

from __future__ import annotations

import functools

import torch

from marlin_cli.errors import CheckpointError, ShapeError
from marlin_cli.formats import marlin
from marlin_cli.grid import ZERO, pack_nibbles, unpack_nibbles

TILE = 16


def shape_problem(k: int, n: int, group_size: int) -> str | None:
    """Why a (K, N) layer cannot be stored in the 2:4 layout with `group_size`, or None when it can: the dense
    layout's rules, with N a multiple of 128 (a warp of the 2:4 kernel owns 128 output columns)."""
    if n % 128:
        return f"out_features={n} is not a multiple of 128 (2:4 Marlin tile)"
    return marlin.shape_problem(k, n, group_size)


@functools.cache
def weight_perm() -> torch.Tensor:
    """Permutation of one 16x64 strip of kept codes (16 compressed K rows x 64 columns): packed[i] = strip[perm[i]].

    Lane i = 4c + t of a warp reads the i-th 16 bytes: compressed rows 2t, 2t+1, 2t+8, 2t+9 (its A fragment of
    mma.sp: chunks t and t + 4 of 32 K) of the 8 columns 8c..8c+7. Word j holds columns 8c + j (nibbles 0, 1, 4, 5)
    and 8c + j + 4 (nibbles 2, 3, 6, 7), so one dequantization gives both rows' fragments, as in the dense layout.
    """
    perm: list[int] = []
    for i in range(32):
        col = i // 4
        lane = [
            16 * row + 256 * (col // 2) + 8 * (col % 2) + 4 * block
            for block in (0, 1)
            for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1)
        ]
        for j in range(4):  # the columns j of the lane's two runs of four
            perm.extend(p + j for p in lane)
    # interleave so the int4 -> fp16 conversion works on pairs of nibbles
    return torch.tensor(perm).reshape(-1, 8)[:, [0, 2, 4, 6, 1, 3, 5, 7]].reshape(-1)


@functools.cache
def meta_perm() -> torch.Tensor:
    """Order of the 64 int16 metadata words of 32 columns x 32 K (one column's word per 16 K): packed[i] = src[perm[i]],
    src index 2 * column + half (half 0: K 0..15, 1: K 16..31).

    mma.sp.m16n8k32 (f16) takes the metadata of its 16 rows from two threads of each group of four (the sparsity
    selector picks threads 0-1 or 2-3): thread 2 * selector + h of group g holds the word of row g (bits 0-15) and of
    row g + 8 (bits 16-31) for K half h. Int32 word 4a + b of the packed row therefore pairs columns a and a + 8
    (b = 0, 1: the 16 columns of selector 0) or a + 16 and a + 24 (b = 2, 3: selector 1), K half b % 2, and lane
    4a + b of a warp loads its word directly. This is CUTLASS's ColumnMajorInterleaved<2> metadata order.
    """
    return torch.tensor(
        [2 * (a + 8 * hi + 16 * (b // 2)) + b % 2 for a in range(8) for b in range(4) for hi in range(2)]
    )


@functools.cache
def scale_perm(grouped: bool) -> torch.Tensor:
    """Column permutation of the scales within 64 columns: grouped scales pair columns j and j + 4 of every 8 (the
    two columns of one B_24 word); per-channel scales keep their order."""
    if grouped:
        return torch.tensor([8 * i + j for i in range(8) for j in (0, 4, 1, 5, 2, 6, 3, 7)])
    return torch.arange(64)


def _check_shape(k: int, n: int, group_size: int) -> None:
    problem = shape_problem(k, n, group_size)
    if problem is not None:
        raise ShapeError(f"2:4 layer ({k}, {n}): {problem}; keep this layer dense or unquantized")


def _group_size(k: int, groups: int) -> int:
    if groups < 1 or k % groups:
        raise ShapeError(f"{groups} scale rows do not divide in_features={k}: scales must be (K/g, N) or (1, N)")
    return -1 if groups == 1 else k // groups


@functools.cache
def _kept_table() -> torch.Tensor:
    """(16, 2) int64: the positions idx0 < idx1 a group of 4 stores, for each mask of its non-zero positions (bit i:
    position i): its non-zeros first, then its lowest zero positions, so `unpack` gives back the codes exactly."""
    rows = []
    for mask in range(16):
        nonzero = [i for i in range(4) if mask >> i & 1]
        zero = [i for i in range(4) if not mask >> i & 1]
        rows.append(sorted((nonzero + zero)[:2]))
    return torch.tensor(rows)


def _check_24(codes: torch.Tensor) -> torch.Tensor:
    """Bool (K/4, 4, N) nonzero mask of the codes; ShapeError naming the first group with more than 2 nonzeros."""
    k, n = codes.shape
    nonzero = (codes != ZERO).reshape(k // 4, 4, n)
    bad = (nonzero.sum(1) > 2).nonzero()
    if len(bad):
        group, col = (int(x) for x in bad[0])
        raise ShapeError(
            f"codes rows {4 * group}..{4 * group + 3} of column {col} hold {int(nonzero[group, :, col].sum())} "
            f"non-zero codes (code != {ZERO}): 2:4 sparsity keeps at most 2 of every 4 consecutive weights along K; "
            "prune the layer to 2:4 before packing it"
        )
    return nonzero


def pack(codes: torch.Tensor, scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """uint8 codes (K, N) in 0..15 obeying 2:4 along K, scales (G, N) -> {"B_24", "B_meta", "s"} (DESIGN.md 3.2).

    Each group of 4 stores its non-zero positions; a group with fewer than 2 also stores its first zero positions
    (code 8), so `unpack` gives back `codes` exactly. The result is on the device of `codes`.
    """
    if codes.dim() != 2 or scales.dim() != 2 or scales.shape[1] != codes.shape[1]:
        raise ShapeError(f"codes {tuple(codes.shape)} and scales {tuple(scales.shape)} must be (K, N) and (G, N)")
    k, n = codes.shape
    _check_shape(k, n, _group_size(k, scales.shape[0]))
    if int(codes.min()) < 0 or int(codes.max()) > 15:
        raise ShapeError(f"codes must be 4-bit (0..15), got {int(codes.min())}..{int(codes.max())}")
    dev = codes.device
    nz = _check_24(codes).to(torch.uint8)
    mask = nz[:, 0] | nz[:, 1] << 1 | nz[:, 2] << 2 | nz[:, 3] << 3  # (K/4, N): bit i set where position i is non-zero
    kept = _kept_table().to(dev)[mask.long()].permute(0, 2, 1)  # (K/4, 2, N)
    values = torch.gather(codes.reshape(k // 4, 4, n), 1, kept).reshape(k // 2, n)

    t = values.reshape(k // 32, TILE, n // TILE, TILE).permute(0, 2, 1, 3)  # (K/32, N/16, 16, 16): 16x16 tiles
    b24 = pack_nibbles(t.reshape(-1, 1024)[:, weight_perm().to(dev)].reshape(k // 32, 2 * n, 8))

    nibbles = (kept[:, 0] | kept[:, 1] << 2).reshape(k // 16, 4, n)  # (K/16, 4, N): 4 groups of 4 per 16 K
    words = pack_nibbles(nibbles.transpose(1, 2), torch.int16)  # (K/16, N)
    m = words.t().reshape(n // 32, 32, k // 32, 2).permute(2, 0, 1, 3)  # (K/32, N/32, 32 columns, 2 K halves)
    m = m.reshape(k // 32, n // 32, 64)[:, :, meta_perm().to(dev)]
    meta = m.reshape(k // 32, 2 * n)

    groups = scales.shape[0]
    perm = scale_perm(groups > 1).to(scales.device)
    s = scales.to(torch.float16).reshape(-1, 64)[:, perm].reshape(groups, n).to(dev).contiguous()
    return {"B_24": b24, "B_meta": meta, "s": s}


@functools.cache
def kernel_word_perm() -> torch.Tensor:
    """The Hopper kernels' order of one k32 row of a 128-column strip of `B_24` (256 words): kernel = stored[perm].

    Stored word 4c + w is word w of the 16-byte chunk c = 8g + 4h + t that lane (g, t) of an mma.sp warp reads. A
    wgmma.sp warp reads word w of every chunk instead (one word per tile pair, kernels/marlin24_sm90.cu), so the kernel
    order groups the words by w, 64 each, and within that by h, rotating each half by 4h + 8w so that the 32 lanes'
    loads of a warp hit 32 banks: stored word 4c + w goes to 64w + 32h + (4g + t + 4h + 8w) % 32.
    """
    i = torch.arange(256)
    c, w = i // 4, i % 4
    g, h, t = c // 8, c // 4 % 2, c % 4
    perm = torch.empty(256, dtype=torch.int64)
    perm[64 * w + 32 * h + (4 * g + t + 4 * h + 8 * w) % 32] = i
    return perm


@functools.cache
def kernel_meta_perm() -> torch.Tensor:
    """The Hopper kernels' order of one k32 row of a 128-column strip of `B_meta` (32 chunks of 16 bytes): kernel =
    stored[perm], chunk c at c ^ (c >> 3 & 3), so that the lanes' metadata loads hit 32 banks. Its own inverse."""
    c = torch.arange(32)
    return c ^ (c >> 3 & 3)


def _permute_strips(b24: torch.Tensor, meta: torch.Tensor, inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if b24.dim() != 2 or meta.shape != b24.shape or b24.shape[1] % 256 or b24.shape[0] % 4:
        raise ShapeError(
            f"B_24 {tuple(b24.shape)}, B_meta {tuple(meta.shape)}: a 2:4 layer is B_24 int32 (K/32, 2N) with K a "
            "multiple of 128 and N a multiple of 128, and B_meta int16 of the same shape"
        )
    words, chunks = kernel_word_perm().to(b24.device), kernel_meta_perm().to(meta.device)
    tiles, strips = b24.shape[0] // 4, b24.shape[1] // 256
    if inverse:
        b = b24.reshape(tiles, strips, 4, 256).transpose(1, 2)[..., torch.argsort(words)]
        m = meta.reshape(tiles, strips, 4, 32, 8).transpose(1, 2)[..., chunks, :]
    else:
        b = b24.reshape(tiles, 4, strips, 256)[..., words].transpose(1, 2)
        m = meta.reshape(tiles, 4, strips, 32, 8)[..., chunks, :].transpose(1, 2)
    return b.reshape(b24.shape).contiguous(), m.reshape(meta.shape).contiguous()


def to_kernel_order(b24: torch.Tensor, meta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`B_24` and `B_meta` as the Hopper (wgmma.sp) kernels read them: new tensors, each 128-column strip's k32 rows
    permuted (kernel_word_perm, kernel_meta_perm) and the four rows of each 128-deep tile of a strip put together
    (tile, strip, row of the four). The checkpoint keeps the stored order, which the mma.sp kernel reads; this one
    lets the Hopper kernels copy a tile's codes and metadata into shared memory as they lie, a bulk copy each."""
    return _permute_strips(b24, meta, inverse=False)


def from_kernel_order(b24: torch.Tensor, meta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact inverse of `to_kernel_order`."""
    return _permute_strips(b24, meta, inverse=True)


def unpack(b24: torch.Tensor, meta: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact inverse of `pack`: (uint8 codes (K, N) with unstored positions = 8, float32 scales (G, N)), on the
    device of the inputs."""
    if b24.dim() != 2 or meta.shape != b24.shape or s.dim() != 2 or b24.shape[1] % 2:
        raise ShapeError(
            f"B_24 {tuple(b24.shape)}, B_meta {tuple(meta.shape)}, s {tuple(s.shape)}: a 2:4 layer is B_24 int32 "
            "(K/32, 2N), B_meta int16 of the same shape and s (G, N)"
        )
    k, n = b24.shape[0] * 32, b24.shape[1] // 2
    if s.shape[1] != n:
        raise ShapeError(f"s {tuple(s.shape)} does not match B_24 {tuple(b24.shape)}: s must have N={n} columns")
    _check_shape(k, n, _group_size(k, s.shape[0]))

    dev = b24.device
    t = unpack_nibbles(b24).reshape(-1, 1024)
    strips = torch.empty_like(t)
    strips[:, weight_perm().to(dev)] = t
    values = strips.reshape(k // 32, n // TILE, TILE, TILE).permute(0, 2, 1, 3).reshape(k // 2, n)

    m = meta.to(dev).reshape(k // 32, n // 32, 64)
    src = torch.empty_like(m)
    src[:, :, meta_perm().to(dev)] = m
    words = src.reshape(k // 32, n // 32, 32, 2).permute(1, 2, 0, 3).reshape(n, k // 16)  # (N, K/16)
    nibbles = unpack_nibbles(words).permute(1, 2, 0).reshape(k // 4, n)  # (K/4, N)
    kept = torch.stack([nibbles & 3, nibbles >> 2], dim=1).to(torch.int64)  # (K/4, 2, N), scatter's index
    bad = (kept[:, 0] >= kept[:, 1]).nonzero()
    if len(bad):
        group, col = (int(x) for x in bad[0])
        raise CheckpointError(
            f"B_meta: the metadata nibble of rows {4 * group}..{4 * group + 3}, column {col} is "
            f"{int(nibbles[group, col]):#06b}; it must name two positions idx0 < idx1 (the tensor is corrupt)"
        )
    codes = torch.full((k // 4, 4, n), ZERO, dtype=torch.uint8, device=dev)
    codes.scatter_(1, kept, values.reshape(k // 4, 2, n))

    groups = s.shape[0]
    perm = scale_perm(groups > 1).to(dev)
    scales = torch.empty(groups * n // 64, 64, dtype=torch.float32, device=dev)
    scales[:, perm] = s.to(dev).float().reshape(-1, 64)
    return codes.reshape(k, n), scales.reshape(groups, n)
