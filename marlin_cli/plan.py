"""`--dry-run`: what a quantize job would do, from the model's config alone (a skeleton on the meta device).

Nothing is downloaded beyond the config, no weight is read and nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModel

from marlin_cli.config import ActOrder, Method, parse_device
from marlin_cli.errors import ModelError
from marlin_cli.io import checkpoint as ckpt
from marlin_cli.io.safetensors_check import read_header
from marlin_cli.model.layout import find_blocks
from marlin_cli.model.load import calibration_length, model_class, resolve
from marlin_cli.pipeline import Job, host_memory, plan_layers, tied_names

GIB = 2**30
# Host memory a GPU run adds once CUDA starts: its context, cuBLAS and cuSOLVER (0.9 GiB measured on the H200,
# docs/gptq-log.md p1).
CUDA_HOST_BYTES = int(0.9 * GIB)


def dry_run(job: Job) -> dict[str, Any]:
    """The layer plan, output shards and estimated peak memory of `job`, without running it."""
    source = resolve(job.model, job.revision, job.trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=job.trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelError(f"{source / 'config.json'}: {str(e).splitlines()[0]}") from None
    archs = getattr(config, "architectures", None) or []  # for the report
    cls = model_class(config)
    with torch.device("meta"):
        model = cls(config) if cls is not None else AutoModel.from_config(config)
    blocks_name, blocks = find_blocks(model)
    plan = plan_layers(blocks_name, blocks, job.quant)
    dtype = _checkpoint_dtype(source)

    # in the order the run writes them: what lies outside the blocks, then block by block; tied weights once
    tied = tied_names(model)
    state = model.state_dict()
    sizes: dict[str, int] = {}
    for name in sorted(state, key=lambda n: n.startswith(f"{blocks_name}.")):  # stable: the blocks keep their order
        if name in tied:
            continue
        t = state[name]
        prefix = name.removesuffix(".weight")
        layer = plan.get(prefix)
        if layer is not None and layer.status == "quantized" and name.endswith(".weight"):
            k, n = layer.in_features, layer.out_features
            groups = 1 if job.quant.group_size == -1 else k // job.quant.group_size
            perm = 4 * k if job.quant.act_order is ActOrder.GROUP else 0
            # 4-bit codes (2:4: the kept half, plus 2 bits of metadata per kept code), fp16 scales, int32 permutation
            codes = 3 * k * n // 8 if job.quant.sparse24 else k * n // 2
            sizes[name] = codes + 2 * groups * n + perm
        else:
            sizes[name] = t.numel() * dtype.itemsize
    shards = ckpt.plan_shards(sizes, job.max_shard_size)

    seqlen = calibration_length(job.calib.seqlen, config, source)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 0)
    block_bytes = max(sum(p.numel() for p in b.parameters()) for b in blocks) * dtype.itemsize
    outside = sum(sizes[k] for k in sizes if not k.startswith(f"{blocks_name}."))
    widest = max((r.in_features, r.out_features) for r in plan.values())
    # the Hessian, GPTQ's working copy of it and two factorization intermediates at a time; copies of W
    solve_bytes = 4 * (widest[0] ** 2 * 4 + widest[0] * widest[1] * 4)
    calibrated = job.quant.method is not Method.RTN
    acts = job.calib.nsamples * seqlen * hidden * dtype.itemsize if calibrated else 0
    working = 2 * acts + solve_bytes  # on the job's device, beside one block
    device = parse_device(job.device)  # a dry run may plan for a GPU this machine lacks
    return {
        "model": job.model,
        "source": str(source),
        "architecture": archs[0] if archs else type(model).__name__,
        "blocks": f"{blocks_name} x {len(blocks)}",
        "layers": [
            {
                "name": r.name,
                "in_features": r.in_features,
                "out_features": r.out_features,
                "action": r.status,
                "reason": r.reason,
            }
            for r in plan.values()
        ],
        "shards": len(shards),
        "output_bytes": sum(sizes.values()),
        "estimated_peak_gpu_gib": round((block_bytes + working) / GIB, 2),
        # blocks are read one at a time and shards written as they fill: what lies outside the blocks, one block, one
        # shard; and the process itself, and on a CPU the calibration activations and the solve's matrices too
        "estimated_peak_host_gib": round(
            (
                _process_bytes(device)
                + (0 if device.type == "cuda" else working)
                + outside
                + block_bytes
                + max(sum(sizes[n] for n in shard) for shard in shards)
            )
            / GIB,
            2,
        ),
        "calibration_tokens_at_most": job.calib.nsamples * seqlen if calibrated else 0,
    }


def _process_bytes(device: torch.device) -> int:
    """What the run's process holds before any weight: this one's resident memory (torch and transformers loaded, as
    there), and CUDA's libraries on a GPU."""
    return host_memory(peak=False) + (CUDA_HOST_BYTES if device.type == "cuda" else 0)


def _checkpoint_dtype(source: Path) -> torch.dtype:
    """The dtype of the model's floating-point weights, from the first safetensors header (fp16 if none says)."""
    names = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}
    for f in sorted(source.glob("*.safetensors")):
        for entry in read_header(f).values():
            if entry["dtype"] in names:
                return names[entry["dtype"]]
    return torch.float16
