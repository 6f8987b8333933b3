"""Per-layer verification of a Marlin checkpoint (dense or 2:4) or of a GPTQ / compressed-tensors export: tensors
against the config, then the kernel against the reference."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from marlin_cli import repack
from marlin_cli.calib.data import embedded_texts, token_samples
from marlin_cli.config import default_device
from marlin_cli.errors import MarlinError, ModelError
from marlin_cli.formats import marlin, marlin24
from marlin_cli.io.checkpoint import REPORT, Checkpoint, sha256
from marlin_cli.kernel import ops, reference
from marlin_cli.model.layout import find_blocks
from marlin_cli.model.load import Loaded, open_model, open_tokenizer
from marlin_cli.model.run import inference, streamed_outputs
from marlin_cli.nn import is_sparse24, quantization_config, quantized_skeleton
from marlin_cli.pipeline import PACKERS, OutputFormat, Progress, ProgressFn

# mean|C - C_ref| / mean|C_ref| allowed between the kernel and the float32 reference: fp16 rounding of the output
# (2^-11 relative at most) plus a different fp32 accumulation order stay well below this.
TOLERANCE = 2e-3
BATCH_SIZES = (1, 16, 33)  # one row, one full tile, and a partial second tile


@dataclass
class LayerCheck:
    name: str
    in_features: int
    out_features: int
    groups: int
    kernel: str
    error: float | None  # worst relative error over BATCH_SIZES
    passed: bool
    problem: str | None = None
    seconds: float = 0.0


# A layer's product as verify runs it: the op (kernel, or reference on the CPU), its operands after the activations,
# and the float32 reference product of float32 activations.
Product = tuple[Callable[..., torch.Tensor], list[Any], Callable[[torch.Tensor], torch.Tensor]]
Checked = str | Product  # the layer's product on a device, or why its stored tensors are wrong


@dataclass
class _Layer:
    name: str
    in_features: int
    out_features: int
    groups: int
    read: Callable[[torch.device], Checked]


def verify_checkpoint(
    path: Path, device: str | None = None, seed: int = 0, on_progress: ProgressFn = lambda _: None
) -> list[LayerCheck]:
    """Check every quantized layer of the checkpoint in `path`, a Marlin one or a GPTQ / compressed-tensors export
    (whose layers go to the kernel as `marlin pack` converts them); tensors are re-read from disk."""
    layers = _export_layers(path) if repack.is_export(path) else _marlin_layers(path)
    dev = default_device(device)
    gen = torch.Generator().manual_seed(seed)
    checks = []
    for i, layer in enumerate(layers):
        on_progress(Progress("layers", i, len(layers), layer.name))
        started = time.perf_counter()
        k = layer.in_features
        check = LayerCheck(layer.name, k, layer.out_features, layer.groups, ops.kernel_name(dev), None, False)
        product = layer.read(dev)
        if isinstance(product, str):
            check.problem = product
        else:
            op, operands, ref = product
            batches = [(torch.rand(m, k, generator=gen) * 2 - 1).to(torch.float16).to(dev) for m in BATCH_SIZES]
            # one reference product for every batch size: the layer is unpacked and dequantized once
            wants = ref(torch.cat(batches).float()).split(BATCH_SIZES)
            check.error = max(_product_error(op, a, want, operands) for a, want in zip(batches, wants))
            check.passed = check.error <= TOLERANCE
            if not check.passed:
                check.problem = f"kernel differs from the reference by {check.error:.2e} (> {TOLERANCE:.0e})"
        check.seconds = round(time.perf_counter() - started, 4)
        checks.append(check)
    on_progress(Progress("layers", len(layers), len(layers), "done"))
    return checks


def _marlin_layers(path: Path) -> list[_Layer]:
    """A Marlin checkpoint's layers: tensors against the config, then the kernel against the reference of the stored
    tensors (unpack, dequantize, matmul)."""
    qc = quantization_config(path)
    store = Checkpoint(path)
    sparse = is_sparse24(path, qc)
    layers = []
    for name, (k, n) in sorted(qc["quantized_modules"].items()):
        groups = 1 if qc["group_size"] == -1 else k // qc["group_size"]
        expected = _expected_tensors(name, k, n, groups, bool(qc.get("desc_act")), sparse)

        def read(dev: torch.device, name: str = name, expected: dict = expected) -> Checked:
            problem = _tensor_problem(store, name, expected)
            if problem is not None:
                return problem
            operands = [store.tensor(t).to(dev) for t in expected]  # the reference's operands, in order
            if sparse:  # the kernel's 2:4 codes and metadata in the order it reads them on this device
                kernel = [ops.prepare24(*operands[:2]), operands[2]]
                return ops.gemm24, kernel, lambda a: reference.gemm24(a, *operands)
            return ops.gemm, operands, lambda a: reference.gemm(a, *operands)

        layers.append(_Layer(name, k, n, groups, read))
    return layers


def _export_layers(path: Path) -> list[_Layer]:
    """A GPTQ or compressed-tensors export's layers: each converted to the Marlin format exactly as `marlin pack`
    converts it, run through the kernel, against the reference of the export's own dequantized weights."""
    src = repack.source_format(path)
    assert src is not None
    store = Checkpoint(path)
    marker, _, scales = repack.KEYS[src.kind]
    layers = []
    for prefix in repack.quantized_layers(store, src):
        # for the table: GPTQ (K bits/32, N), compressed (N, K bits/32); read() refuses other shapes
        rows, cols = (store.entry(f"{prefix}.{marker}")["shape"] + [0, 0])[:2]
        k, n = (rows * 32 // src.bits, cols) if src.kind == repack.GPTQ else (cols * 32 // src.bits, rows)
        shape = store.entry(f"{prefix}.{scales}")["shape"] if f"{prefix}.{scales}" in store.file_of else []
        groups = (shape + [0, 0])[0 if src.kind == repack.GPTQ else 1]

        def read(dev: torch.device, prefix: str = prefix, k: int = k, n: int = n, groups: int = groups) -> Checked:
            try:  # decoded and converted on the device, as `marlin pack` does there
                tensors = repack.layer_tensors(store, src, prefix, dev)
                weight = repack.dequantize(src, prefix, tensors)  # (N, K), the format's own decoding
                problem = marlin.shape_problem(k, n, repack.group_size(src, prefix, k, groups or 1))
                result = repack.exact(src, prefix, tensors)
            except MarlinError as e:
                return str(e)
            if problem is not None:
                return f"{problem}: the Marlin kernel cannot run this layer"
            packed = PACKERS[OutputFormat.MARLIN](result)
            operands = [packed["B"], packed["s"], packed.get("perm")]
            return ops.gemm, operands, lambda a: a @ weight.T

        layers.append(_Layer(prefix, k, n, groups, read))
    return layers


def checksum_problems(path: Path, on_progress: ProgressFn = lambda _: None) -> list[str]:
    """Shards whose sha256 differs from the one the quantization report recorded (nothing to check without a report;
    a report without the checksums is a problem: it was changed or cut short)."""
    if not (path / REPORT).is_file():
        return []
    try:
        recorded = json.loads((path / REPORT).read_text())["files"]["shards"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = None
    if not isinstance(recorded, dict):
        return [f"{REPORT}: no files.shards mapping of shard names to sha256 digests, so the shards cannot be checked"]
    problems = []
    for i, (name, want) in enumerate(sorted(recorded.items())):
        on_progress(Progress("checksums", i, len(recorded), name))
        if not (path / name).is_file() or sha256(path / name) != want:
            problems.append(f"{name}: sha256 differs from {REPORT} (the file changed after it was written)")
    on_progress(Progress("checksums", len(recorded), len(recorded), "done"))
    return problems


def _expected_tensors(
    name: str, k: int, n: int, groups: int, act_order: bool, sparse: bool
) -> dict[str, tuple[str, list[int]]]:
    """Tensor -> (safetensors dtype, shape) the config implies for one layer, in the order the op takes them."""
    if sparse:
        packed = [k // 32, 2 * n]
        return {f"{name}.B_24": ("I32", packed), f"{name}.B_meta": ("I16", packed), f"{name}.s": ("F16", [groups, n])}
    expected = {f"{name}.B": ("I32", [k // 16, 2 * n]), f"{name}.s": ("F16", [groups, n])}
    if act_order:
        expected[f"{name}.perm"] = ("I32", [k])
    return expected


def _tensor_problem(store: Checkpoint, name: str, expected: dict[str, tuple[str, list[int]]]) -> str | None:
    """Why the layer's stored tensors disagree with the config (or the 2:4 rule), or None."""
    for tensor, (dtype, shape) in expected.items():
        if tensor not in store.file_of:
            return f"tensor {tensor} is missing"
        entry = store.entry(tensor)
        if entry["dtype"] != dtype or entry["shape"] != shape:
            return f"tensor {tensor} is {entry['dtype']} {entry['shape']}, the config implies {dtype} {shape}"
    problem = repack.scales_problem(f"{name}.s", store.tensor(f"{name}.s"))
    if problem is not None:
        return problem
    if f"{name}.perm" in expected:
        k = expected[f"{name}.perm"][1][0]
        if not torch.equal(store.tensor(f"{name}.perm").sort().values, torch.arange(k, dtype=torch.int32)):
            return f"tensor {name}.perm is not a permutation of 0..{k - 1}"
    if f"{name}.B_meta" in expected:  # the 2:4 rule: every metadata nibble names two kept positions idx0 < idx1
        try:
            marlin24.unpack(*(store.tensor(t) for t in expected))
        except MarlinError as e:
            return f"tensor {name}.B_meta breaks the 2:4 rule: {e}"
    return None


def _product_error(op: Callable[..., torch.Tensor], a: torch.Tensor, want: torch.Tensor, operands: list[Any]) -> float:
    """Worst-case check of one batch: op (kernel, or reference on the CPU) on a against the float32 reference."""
    got = torch.full_like(want, float("nan"), dtype=torch.float16)  # poisoned: an unwritten output cannot pass
    got.copy_(op(a, *operands))
    err = (got.float() - want).abs().mean() / want.abs().mean()
    return float(err) if bool(torch.isfinite(got).all()) else float("inf")


@dataclass
class ModelCheck:
    """The quantized model against the original on held-out text."""

    original: str
    tokens: int
    kind: str  # "logits": per-token KL and top-1 agreement; "hidden": cosine of the last hidden states
    kl: float | None = None  # mean per-token KL(original || quantized), nats
    top1: float | None = None  # fraction of tokens whose argmax agrees
    cosine: float | None = None  # mean per-token cosine of the last hidden state


def model_check(
    path: Path,
    original: Path,
    device: str | None = None,
    nsamples: int = 16,
    seqlen: int = 256,
    on_progress: ProgressFn = lambda _: None,
) -> ModelCheck:
    """Run held-out text from the embedded corpus through the original and the quantized model (kernel on a GPU)."""
    dev = default_device(device)
    try:
        return _model_check(path, original, dev, nsamples, seqlen, on_progress)
    except torch.OutOfMemoryError:
        raise ModelError(
            f"--model-check: one block of the original model ({original}) or of the quantized one, with the "
            f"embeddings and head, does not fit in {dev}'s memory; verify without --model-check (every layer is still "
            "checked through the kernel), or on a device with more memory (--device)"
        ) from None


def _model_check(
    path: Path, original: Path, dev: torch.device, nsamples: int, seqlen: int, on_progress: ProgressFn
) -> ModelCheck:
    samples = token_samples(embedded_texts("heldout"), open_tokenizer(path), nsamples, seqlen, seed=0)
    tokens = sum(ids.numel() for ids in samples)
    source = open_model(original, lazy=True)
    blocks_name, blocks = find_blocks(source.model)
    quantized = quantized_skeleton(path)
    theirs = dict(quantized.model.named_modules()).get(blocks_name)
    if not isinstance(theirs, torch.nn.ModuleList) or len(theirs) != len(blocks):
        raise ModelError(
            f"--model-check: {path} does not have the {len(blocks)} blocks ({blocks_name}) of {original}; pass the "
            "model it was made from as --original"
        )

    def run(loaded: Loaded, stage: str) -> Iterator[tuple[bool, torch.Tensor]]:
        def on_block(done: int, total: int) -> None:
            on_progress(Progress(stage, done, total, f"block {done}/{total}" if done < total else "done"))

        return _outputs(streamed_outputs(loaded, blocks_name, samples, dev, on_block))

    # Both models block by block, one after the other, the original's outputs waiting on the host: the device holds
    # one block and the tensors outside the blocks, so a model quantized on a device can be checked on it. They wait
    # in the dtype the model computed them in, half the bytes of float32 for a 16-bit model (a 128k vocabulary and
    # 16 samples of 256 tokens: 1.05 GB of logits); the figures are computed in float32 all the same.
    kls, agree, cosines = [], [], []
    with inference():
        wants = [(logits, out.cpu()) for logits, out in run(source, "original")]
        for (logits, want), (_, got) in zip(wants, run(quantized, "quantized")):
            want, got = want.to(dev).float(), got.float()
            if logits:
                want, got = want.log_softmax(-1), got.log_softmax(-1)
                kls.append((want.exp() * (want - got)).sum(-1).flatten())
                agree.append((want.argmax(-1) == got.argmax(-1)).flatten().float())
            else:
                cosines.append(torch.nn.functional.cosine_similarity(want, got, dim=-1).flatten())
    if kls:
        return ModelCheck(
            str(original), tokens, "logits", kl=float(torch.cat(kls).mean()), top1=float(torch.cat(agree).mean())
        )
    return ModelCheck(str(original), tokens, "hidden", cosine=float(torch.cat(cosines).mean()))


def _outputs(outputs: Iterator[Any]) -> Iterator[tuple[bool, torch.Tensor]]:
    """Per sample: (True, the logits) for a model with a head, else (False, the last hidden states), as computed."""
    for out in outputs:
        if hasattr(out, "logits"):
            yield True, out.logits
        else:
            yield False, out.last_hidden_state
