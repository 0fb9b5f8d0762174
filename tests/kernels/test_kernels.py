"""vlcache's CPU kernels: the fused activation and the MKL-packed linear equal PyTorch's, and
the loader degrades to PyTorch's operators when the kernels are off or cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from vlcache import kernels
from vlcache.models import adapter as adapter_module

needs_kernels = pytest.mark.skipif(kernels.cpu_kernels() is None,
                                   reason=f"vlcache's CPU kernels: {kernels.status()}")


@needs_kernels
@pytest.mark.parametrize("shape", [(1, 5), (7, 33), (64, 4864)])
def test_silu_mul_equals_silu_times_up(shape):
    gen = torch.Generator().manual_seed(0)
    rows, cols = shape
    x = torch.randn(rows, 2 * cols, generator=gen) * 6  # saturated gates included
    g, u = x[:, :cols], x[:, cols:]  # strided rows, as the fused projection gives them
    out = torch.empty(rows, cols)
    kernels.cpu_kernels().silu_mul(g, u, out)
    torch.testing.assert_close(out, F.silu(g) * u, atol=1e-6, rtol=1e-6)
    inplace = g.clone()
    kernels.cpu_kernels().silu_mul(inplace, u, inplace)
    assert torch.equal(inplace, out)
    gate_bias, up_bias = torch.randn(2, cols, generator=gen).unbind()
    kernels.cpu_kernels().silu_mul(g, u, out, gate_bias, up_bias)
    torch.testing.assert_close(out, F.silu(g + gate_bias) * (u + up_bias), atol=1e-6, rtol=1e-6)
    kernels.cpu_kernels().silu_mul(g, u, out, None, up_bias)  # either bias may be missing
    torch.testing.assert_close(out, F.silu(g) * (u + up_bias), atol=1e-6, rtol=1e-6)
    with pytest.raises(RuntimeError, match="bias"):
        kernels.cpu_kernels().silu_mul(g, u, out, torch.zeros(cols + 1))


@needs_kernels
def test_the_mlp_uses_the_kernel_and_equals_the_module(monkeypatch):
    class Mlp(torch.nn.Module):  # transformers' gated MLP layout
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj, self.up_proj = torch.nn.Linear(16, 40), torch.nn.Linear(16, 40)
            self.down_proj, self.act_fn = torch.nn.Linear(40, 16), torch.nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    mlp, x = Mlp(), torch.randn(9, 16)
    calls = []
    real = kernels.cpu_kernels().silu_mul
    monkeypatch.setattr(kernels.cpu_kernels(), "silu_mul", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        torch.testing.assert_close(adapter_module._mlp(mlp, x), mlp(x), atol=1e-6, rtol=1e-6)
        assert calls == [1]
        adapter_module._mlp(mlp.bfloat16(), x.bfloat16())  # bf16: PyTorch's operators
    assert calls == [1]


@needs_kernels
def test_mkl_packed_linear_equals_linear_at_any_row_count():
    ops = kernels.cpu_kernels()
    if not ops.mkl_packing():
        pytest.skip("PyTorch's BLAS here has no cblas_sgemm_pack")
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(72, 40, generator=gen)  # [out, in]
    bias = torch.randn(72, generator=gen)
    kept = bias.clone()
    packed = ops.mkl_pack(weight, 4096)  # packed for many rows, used by any count
    for rows in (0, 1, 2, 25, 26, 300):
        x = torch.randn(rows, 40, generator=gen)
        torch.testing.assert_close(ops.mkl_linear(x, packed, 72), x @ weight.T,
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ops.mkl_linear(x, packed, 72, bias), F.linear(x, weight, bias),
                                   atol=1e-5, rtol=1e-5)
    assert torch.equal(bias, kept)  # the output starts as a copy of the bias, never a view
    with pytest.raises(RuntimeError, match="bias"):
        ops.mkl_linear(x, packed, 72, torch.zeros(71))
    with pytest.raises(RuntimeError, match="contiguous"):
        ops.mkl_linear(torch.randn(40, 3).T, packed, 72)


@pytest.fixture
def fresh_loader(monkeypatch):
    monkeypatch.setattr(kernels, "_state", {})
    return kernels


def test_turned_off_by_the_environment(fresh_loader, monkeypatch):
    monkeypatch.setenv(kernels.ENV, "0")
    built = []
    monkeypatch.setattr(kernels, "_build", lambda: built.append(1))
    assert fresh_loader.cpu_kernels() is None and built == []
    assert fresh_loader.status() == f"off ({kernels.ENV}=0)"
    assert not fresh_loader.usable(torch.zeros(1))


def test_a_failed_build_falls_back_once_with_a_warning(fresh_loader, monkeypatch, caplog):
    monkeypatch.delenv(kernels.ENV, raising=False)
    attempts = []

    def broken():
        attempts.append(1)
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(kernels, "_build", broken)
    with caplog.at_level(logging.WARNING, logger="vlcache.kernels"):
        assert fresh_loader.cpu_kernels() is None and fresh_loader.cpu_kernels() is None
    assert attempts == [1]  # not retried
    assert "no C++ compiler" in fresh_loader.status() and "PyTorch's operators" in caplog.text


def test_the_build_directory_names_source_path_torch_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("VLCACHE_KERNEL_CACHE", str(tmp_path))
    first = kernels.build_dir()
    assert first.parent == tmp_path
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: "sse2")
    assert kernels.build_dir() != first  # another CPU: another build
    monkeypatch.undo()
    monkeypatch.setenv("VLCACHE_KERNEL_CACHE", str(tmp_path))
    copy = tmp_path / "elsewhere" / "cpu.cpp"  # the same source in another checkout
    copy.parent.mkdir()
    copy.write_bytes(kernels.SOURCE.read_bytes())
    monkeypatch.setattr(kernels, "SOURCE", copy)
    assert kernels.build_dir() != first  # another checkout: another build (no rebuilds back
    # and forth in one directory)


def test_keep_freed_memory_takes_effect_on_glibc_and_obeys_the_environment(monkeypatch):
    from vlcache.kernels import malloc

    monkeypatch.setattr(malloc, "_done", [])
    monkeypatch.setenv(malloc.ENV, "0")
    assert malloc.keep_freed_memory() is False
    monkeypatch.setattr(malloc, "_done", [])
    monkeypatch.delenv(malloc.ENV)
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert malloc.keep_freed_memory() is True and malloc._done == [True]
