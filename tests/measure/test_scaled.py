"""Scaled GEMMs (measure/scaled.py): the recipes' quantisation, torch._scaled_mm's operands, and the
FP8/MX/NVFP4 modes run on a model."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from preclint.core.numerics import E2M1, E4M3, E5M2, MODES, SCALED_MODES
from preclint.measure.runners import run_mode, run_reference, runner_for
from preclint.measure.scaled import (ScaledLinear, convert_linears, encoding_scale, group_amax, quantise,
                                     round_element, scaled_mm_linear, scaled_mm_operands)


@pytest.mark.parametrize("fmt, dtype", [(E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)])
def test_round_element_is_the_float8_cast(fmt, dtype):
    torch.manual_seed(0)
    x = (torch.randn(50000) * torch.exp(torch.randn(50000) * 4)).clamp(-fmt.max_finite, fmt.max_finite)
    assert torch.equal(round_element(x, fmt), x.to(dtype).float())


def test_e2m1_grid_ties_to_even_and_saturates():
    x = torch.tensor([0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -9.0])
    assert round_element(x, E2M1).tolist() == [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -6.0]


def test_tensorwise_scale_is_448_over_amax_and_floored():
    recipe = MODES["fp8"].recipe
    x = torch.tensor([[0.5, -2.0], [1.0, 0.25]])
    assert float(encoding_scale(group_amax(x, recipe), recipe)) == pytest.approx(448 / 2.0)
    zero = torch.zeros(2, 16)
    assert torch.isfinite(quantise(zero, recipe)).all()  # torchao's EPS keeps 448/0 finite
    unfloored = dataclasses.replace(recipe, amax_epsilon=0.0)
    assert torch.isnan(quantise(zero, unfloored)).all()  # 0 * inf: the NaN users meet


def test_rowwise_scales_are_powers_of_two_per_row():
    recipe = MODES["fp8-rowwise"].recipe
    x = torch.randn(8, 32) * torch.arange(1, 9).unsqueeze(1)
    scale = encoding_scale(group_amax(x, recipe), recipe)
    assert scale.shape == (8, 1)
    assert torch.equal(torch.log2(scale), torch.log2(scale).round())
    assert (group_amax(x, recipe).float() * scale <= 448).all()


def test_mx_blocks_of_32_have_e8m0_scales_and_nvfp4_e4m3_block_scales():
    torch.manual_seed(1)
    x = torch.randn(4, 64) * torch.exp(torch.randn(4, 64))
    mx = MODES["mxfp8"].recipe
    scale = encoding_scale(group_amax(x, mx), mx)
    assert scale.shape == (8, 1) and torch.equal(torch.log2(scale), torch.log2(scale).round())
    nv = MODES["nvfp4"].recipe
    amax = group_amax(x, nv)
    decode = 1.0 / encoding_scale(amax, nv)
    tensor_scale = float(x.abs().max()) / (448 * 6)
    block = decode / tensor_scale
    assert amax.shape == (16, 1)
    assert torch.allclose(round_element(block.float(), E4M3), block.float(), rtol=1e-6)
    q = quantise(x, nv)
    assert len(torch.unique((q / torch.repeat_interleave(decode.reshape(4, 4), 16, dim=1)).abs().round(decimals=4))) <= 8


@pytest.mark.parametrize("mode", ["fp8", "fp8-rowwise"])
def test_scaled_mm_operands_are_what_scaled_mm_takes_and_match_the_emulation(mode):
    recipe = MODES[mode].recipe
    torch.manual_seed(2)
    x, weight, bias = torch.randn(3, 5, 64), torch.randn(48, 64), torch.randn(48)
    a, b, scale_a, scale_b = scaled_mm_operands(x.reshape(-1, 64).bfloat16(), weight, recipe)
    assert a.dtype == b.dtype == torch.float8_e4m3fn and a.shape == (15, 64) and b.shape == (64, 48)
    assert b.stride() == (1, 64)  # column-major
    assert scale_a.dtype == scale_b.dtype == torch.float32
    assert (scale_a.shape, scale_b.shape) == (((), ()) if mode == "fp8" else ((15, 1), (1, 48)))
    hardware = scaled_mm_linear(x, weight, bias, recipe)  # the CPU has _scaled_mm kernels too
    layer = torch.nn.Linear(64, 48)
    layer.weight.data, layer.bias.data = weight, bias
    emulated = ScaledLinear(layer, recipe, "emulated", native=True)(x)
    assert hardware.shape == (3, 5, 48) and hardware.dtype == emulated.dtype == torch.bfloat16
    assert torch.equal(hardware, emulated)


def test_scaled_mm_refuses_shapes_its_kernels_reject():
    with pytest.raises(ValueError, match="multiples of 16"):
        scaled_mm_operands(torch.randn(4, 24).bfloat16(), torch.randn(32, 24), MODES["fp8"].recipe)
    with pytest.raises(ValueError, match="tensorwise and rowwise"):
        scaled_mm_operands(torch.randn(4, 32).bfloat16(), torch.randn(32, 32), MODES["mxfp8"].recipe)


class _Block(torch.nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.norm, self.up, self.down, self.head = (torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d),
                                                    torch.nn.Linear(4 * d, d), torch.nn.Linear(d, 10))

    def forward(self, x):
        x = x + self.down(torch.relu(self.up(self.norm(x))))
        return self.head(x)


def test_convert_linears_takes_the_layers_torchao_would():
    model = _Block()
    assert convert_linears(model, MODES["fp8"].recipe, "emulated", native=False) == ["up", "down"]
    assert isinstance(model.up, ScaledLinear) and type(model.head) is torch.nn.Linear
    assert dict(model.named_parameters()).keys() == dict(_Block().named_parameters()).keys()


@pytest.mark.parametrize("mode", SCALED_MODES)
def test_scaled_modes_run_emulated_and_say_so(mode):
    torch.manual_seed(3)
    model, x = _Block().eval(), torch.randn(2, 8, 32)
    reference = run_reference(model, (x,))
    bf16 = run_mode(model, (x,), "bf16")
    out = run_mode(model, (x,), mode)
    error = float((out.double() - reference).norm() / reference.norm())
    assert out.dtype == torch.bfloat16
    assert error > float((bf16.double() - reference).norm() / reference.norm())
    assert error < (0.3 if mode == "nvfp4" else 0.1)
    assert "emulated" in runner_for(mode, "cpu").how
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fp8", "fp8-rowwise"])
def test_real_fp8_gemms_agree_with_the_emulation(mode):
    from preclint.measure.scaled import hardware_fp8

    device = torch.device("cuda")
    if not torch.cuda.is_available() or not hardware_fp8(device):
        pytest.skip("needs a GPU with FP8 tensor cores (compute capability 8.9+)")
    torch.manual_seed(4)
    layer = torch.nn.Linear(1024, 512).to(device)
    x = torch.randn(256, 1024, device=device)
    recipe = MODES[mode].recipe
    reference = torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
    hardware = ScaledLinear(layer, recipe, "scaled_mm", native=True)(x).double()
    emulated = ScaledLinear(layer, recipe, "emulated", native=True)(x).double()
    error = lambda y: float((y - reference).norm() / reference.norm())  # noqa: E731
    assert hardware.dtype == emulated.dtype and error(hardware) == pytest.approx(error(emulated), rel=0.2)
    assert run_mode(torch.nn.Sequential(layer), (x,), mode, device, emulated=False).dtype == torch.bfloat16
    assert "torch._scaled_mm" in runner_for(mode, device, emulated=False).how
