"""Random Marlin operands, a GPU-side unpack (the CPU unpack is slow for 70B shapes) and random GPTQ /
compressed-tensors exports for the GPU tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from marlin_cli import grid
from marlin_cli.formats import compressed_tensors, gptq, marlin

EXPORT_SHAPES = [(256, 512), (512, 1024), (1024, 256)]  # (K, N); N = 1024 lets the batch-33 product take 256 columns


def random_operands(
    m: int, k: int, n: int, group: int, device: str = "cuda", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fp16 (m, k) ~ N(0, 1), B random packed int32 (k/16, 2n) (every bit pattern is a valid code set),
    packed fp16 scales (k/g, n) in [0.5, 1.5) / 64. Nothing is zero, so unwritten or mis-indexed outputs show."""
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=gen, device=device).half()
    b = torch.randint(-(2**31), 2**31 - 1, (k // 16, 2 * n), generator=gen, device=device, dtype=torch.int64)
    b = b.to(torch.int32)
    groups = 1 if group == -1 else k // group
    s = ((torch.rand(groups, n, generator=gen, device=device) + 0.5) / 64).half()
    return a, b, pack_scales_gpu(s)


def pack_scales_gpu(s: torch.Tensor) -> torch.Tensor:
    groups, n = s.shape
    perm = marlin.scale_perm(groups > 1).to(s.device)
    return s.reshape(-1, perm.numel())[:, perm].reshape(groups, n).contiguous()


def unpack_weight_gpu(packed: torch.Tensor) -> torch.Tensor:
    """Same result as marlin.unpack_weight (tested against it), computed on packed's device."""
    k, n = packed.shape[0] * 16, packed.shape[1] // 2
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    t = ((packed.unsqueeze(-1) >> shifts) & 0xF).to(torch.uint8).reshape(-1, 1024)  # one row per 16x64 strip
    out = torch.empty_like(t)
    out[:, marlin.weight_perm().to(packed.device)] = t
    out = out.reshape(k // 16, n // 16, 16, 16).permute(0, 2, 1, 3)  # (K/16, 16, N/16, 16)
    return out.reshape(k, n)


def dequantize_gpu(b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """float32 W (k, n), the same values as reference.dequantize."""
    codes = unpack_weight_gpu(b)
    groups, n = s.shape
    perm = marlin.scale_perm(groups > 1).to(s.device)
    scales = torch.empty_like(s).reshape(-1, perm.numel())
    scales[:, perm] = s.reshape(-1, perm.numel())
    return grid.decode(codes, scales.reshape(groups, n).float().repeat_interleave(codes.shape[0] // groups, dim=0))


def rel_error(c: torch.Tensor, ref: torch.Tensor) -> float:
    """mean |c - ref| / mean |ref| in float32; NaN anywhere in c gives inf."""
    if not torch.isfinite(c).all():
        return float("inf")
    return ((c.float() - ref).abs().mean() / ref.abs().mean()).item()


# idx0 | idx1 << 2 for the six pairs of kept positions idx0 < idx1 of a group of 4 (marlin24 metadata nibbles)
META_NIBBLES = (0b0100, 0b1000, 0b1100, 0b1001, 0b1101, 0b1110)


def random_operands24(
    m: int, k: int, n: int, group: int, device: str = "cuda", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fp16 (m, k) ~ N(0, 1), a random 2:4 layer (B_24 int32 (k/32, 2n): every bit pattern is a valid set of kept
    codes; B_meta int16 (k/32, 2n): a random valid pair of positions for every group of 4) and packed fp16 scales
    (k/g, n) in [0.5, 1.5) / 64. Nothing is zero, so unwritten or mis-indexed outputs show."""
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=gen, device=device).half()
    b24 = torch.randint(-(2**31), 2**31 - 1, (k // 32, 2 * n), generator=gen, device=device, dtype=torch.int64)
    pick = torch.randint(0, len(META_NIBBLES), (k // 32, 2 * n, 4), generator=gen, device=device)
    meta = grid.pack_nibbles(torch.tensor(META_NIBBLES, device=device)[pick], torch.int16)
    groups = 1 if group == -1 else k // group
    s = ((torch.rand(groups, n, generator=gen, device=device) + 0.5) / 64).half()
    return a, b24.to(torch.int32), meta, s


def poison(m: int, n: int) -> None:
    """Leave a NaN-filled block of C's size in the caching allocator, so an op's fresh output starts as NaN."""
    t = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    del t


def block_slots() -> int:
    """Blocks the GPU holds at once at the kernels' two per SM (kMaxBlocksPerSm in kernels/marlin.h)."""
    return 2 * torch.cuda.get_device_properties(0).multi_processor_count


def kernels_launched(run: Callable[[], object]) -> str:
    """The names of the CUDA kernels one call of `run` launches, after a warm-up call (build, first launch)."""
    run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], acc_events=True) as prof:
        run()
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events())


def write_export(path: Path, fmt: str, group: int, act_order: bool) -> None:
    """Random codes, positive scales and (act_order) a shuffled g_idx for each of EXPORT_SHAPES, written as `fmt`
    (gptq or compressed-tensors) prescribes."""
    gen = torch.Generator().manual_seed(group + act_order)
    tensors = {}
    for i, (k, n) in enumerate(EXPORT_SHAPES):
        groups = 1 if group == -1 else k // group
        codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
        scales = (torch.rand(groups, n, generator=gen) + 0.5) / 64
        perm = torch.randperm(k, generator=gen) if act_order else None
        if perm is not None:  # stored rows sorted by group, as from_natural makes them
            perm = perm.reshape(groups, -1).sort(1).values.reshape(-1)
        layer = gptq.Layer(codes, scales.half().float(), perm)
        packed = gptq.to_gptq(layer) if fmt == "gptq" else compressed_tensors.to_compressed(layer)
        tensors |= {f"layers.{i}.proj.{name}": t for name, t in packed.items()}
    path.mkdir()
    save_file(tensors, path / "model.safetensors")
    if fmt == "gptq":
        qc = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": True}
    else:
        weights = {"num_bits": 4, "symmetric": True, "strategy": "channel" if group == -1 else "group"}
        weights |= {"group_size": group} if group != -1 else {}
        groups = {"group_0": {"targets": ["Linear"], "weights": weights}}
        qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": groups}
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "quantization_config": qc}))
