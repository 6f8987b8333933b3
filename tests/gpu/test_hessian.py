"""The Hessian on the GPU from fp16 / bf16 inputs: cuBLAS multiplies the half-precision values on the tensor cores
straight into a float32 result, without converting the inputs. The products are exact in float32, but the tensor
cores' float32 sums drop low bits: on the H200 the largest error is ~2.5e-5 of the largest entry, against ~6e-7 when
the inputs are converted to float32 first. That is 400 times below the default damping (1% of the mean diagonal)
and far below the sampling noise of a calibration set, and GPTQ on either Hessian must give the same result: the same
Hessian-weighted error within 0.1% (measured: within 0.003%) and at least 99.5% identical codes (measured: 99.82%
from fp16, 99.94% from bf16; a rounding tie that falls the other way changes one code and nudges later columns).
"""

from __future__ import annotations

import pytest
import torch

from marlin_cli.algo import hessian
from marlin_cli.algo.gptq import gptq
from marlin_cli.algo.hessian import Hessian, weighted_error
from marlin_cli.config import QuantConfig

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_give_the_same_gptq_result(dtype: torch.dtype) -> None:
    if not hessian._HALF_INPUTS_FLOAT_OUT:
        pytest.skip("this torch has no addmm with a float32 result for fp16 / bf16 inputs")
    k, tokens = 768, 12_000
    gen = torch.Generator(device="cuda").manual_seed(0)
    mix = torch.randn(k, 32, generator=gen, device="cuda")  # correlated channels, like real activations
    shared = torch.randn(tokens, 32, generator=gen, device="cuda")
    x = torch.randn(tokens, k, generator=gen, device="cuda") + shared @ mix.T
    x = (x * torch.rand(k, generator=gen, device="cuda") * 20).to(dtype)  # channels of unequal scale, up to ~600
    half, single = Hessian(k, "cuda"), Hessian(k, "cuda")
    for chunk in x.split(5000):  # uneven batches: the running mean is rescaled twice
        half.add(chunk)
        single.add(chunk.float())
    assert half.tokens == single.tokens == tokens
    ref = 2 * x.double().T @ x.double() / tokens
    errors = [((h.matrix.double() - ref).abs().max() / ref.abs().max()).item() for h in (half, single)]

    w = torch.randn(512, k, generator=gen, device="cuda")
    got, want = (gptq(w, h.matrix, QuantConfig()) for h in (half, single))
    same = (got.codes == want.codes).float().mean().item()
    ratio = weighted_error(w - got.weight(), single.matrix) / weighted_error(w - want.weight(), single.matrix)
    print(
        f"\n{dtype}: largest error / largest entry: half inputs {errors[0]:.2e}, float32 inputs {errors[1]:.2e};"
        f" GPTQ codes identical {same:.4%}, error ratio {ratio:.5f}"
    )
    assert errors[0] <= 1e-4 and errors[1] <= 1e-5
    assert same >= 0.995
    assert abs(ratio - 1) <= 1e-3
