"""Quantization maths on plain tensors, and the quantized store's bytes."""

from __future__ import annotations

import pytest
import torch

from couplet.kvcache.codec import dequantize, gather_rows, pack_int4, quantize, unpack_int4
from couplet.kvcache.quant_store import QuantStore
from couplet.kvcache.storage import storage_bytes

torch.set_num_threads(1)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantized_error_within_half_a_step(bits: int, symmetric: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(bits)
    x = (torch.randn(2, 3, 5, 32) * torch.logspace(-2, 1, 32)).to(dtype)  # channels of very different scales
    x[0, 0, 0] = 0.0  # an all-zero group
    q = quantize(x, bits, group=16, symmetric=symmetric)
    back = dequantize(q, torch.float32)
    step = q.scale.float().repeat_interleave(16, dim=-1)
    # exact arithmetic gives |err| <= step / 2; float32 dequantization adds at most a few ulps
    assert ((back - x.float()).abs() <= step / 2 * (1 + 1e-5) + 1e-7).all()
    assert back[0, 0, 0].eq(0).all()
    assert q.scale.dtype == dtype and (q.zero is None) == symmetric


def test_int4_really_packs_two_codes_per_byte() -> None:
    x = torch.randn(1, 2, 6, 32)
    q = quantize(x, 4, group=32)
    assert q.data.dtype == torch.uint8 and q.data.shape == (1, 2, 6, 16)
    assert q.data.numel() * q.data.element_size() == x.numel() // 2
    codes = torch.randint(0, 16, (3, 8), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(codes)), codes)
    assert quantize(x, 8, group=32).data.dtype == torch.int8


def test_gather_rows_is_a_gather_of_codes_and_scales() -> None:
    x = torch.randn(1, 2, 6, 8)
    q = quantize(x, 4, group=8)
    index = torch.tensor([[[0, 2, 5], [1, 3, 4]]])
    picked = dequantize(gather_rows(q, index), torch.float32)
    full = dequantize(q, torch.float32)
    assert torch.equal(picked, full.gather(2, index[..., None].expand(1, 2, 3, 8)))


@pytest.mark.parametrize("bits, per_token", [(8, 32 + 2), (4, 16 + 2)])
@pytest.mark.parametrize("residual", [0, 2])
def test_store_bytes_are_the_real_storage(bits: int, per_token: int, residual: int) -> None:
    """bf16, head_dim 32, 2 heads: a quantized token costs 2 (K, V) x 2 heads x (codes + one bf16 scale);
    a residual token 2 x 2 x 32 x 2 B. The reported bytes are the tensors' storage, nothing else."""
    store = QuantStore(bits, None, residual)
    tokens = torch.randn(1, 2, 20, 32, dtype=torch.bfloat16)
    store.update(tokens[:, :, :7], tokens[:, :, :7])
    QuantStore.flush_all([store])  # what the cache does after every forward
    for t in range(7, 20):
        store.update(tokens[:, :, t:t + 1], tokens[:, :, t:t + 1])
        QuantStore.flush_all([store])
    held = store.tensors()
    assert store.nbytes() == storage_bytes(held) == sum(t.numel() * t.element_size() for t in held)
    assert store.nbytes() == (20 - residual) * 2 * 2 * per_token + residual * 2 * 2 * 32 * 2
    assert store.residual_len == residual and store.length == 20
    k, _ = store.kv()
    if residual:  # the most recent tokens are exact
        assert torch.equal(k[:, :, -residual:], tokens[:, :, -residual:])


def test_store_returns_new_tokens_at_full_precision() -> None:
    store = QuantStore(4, None, residual=0)
    x = torch.randn(1, 2, 5, 8)
    k, v = store.update(x, x)
    # a prefill (several tokens) is attended at full precision and quantized at once, in its own layer
    assert torch.equal(k, x) and store.residual_len == 0 and store.n_quantized == 5
    y = torch.randn(1, 2, 1, 8)
    k, _ = store.update(y, y)
    assert torch.equal(k[:, :, -1:], y) and not torch.equal(k[:, :, :5], x)  # old rows come back dequantized
    assert store.residual_len == 1  # one token per step: quantized after the forward, all layers at once
    QuantStore.flush_all([store])
    assert store.residual_len == 0 and store.length == 6
    other = QuantStore(4, None, residual=0)
    other.update(y, y)
    other.update(y, y)  # nobody flushed in between: the store catches up itself
    assert other.residual_len == 1 and other.n_quantized == 1


def test_flushing_all_layers_at_once_equals_one_by_one() -> None:
    stores, alone = [QuantStore(4, None, 1) for _ in range(3)], [QuantStore(4, None, 1) for _ in range(3)]
    for step in range(4):
        xs = [torch.randn(1, 2, 3 if step == 0 else 1, 8) for _ in range(3)]
        for s, a, x in zip(stores, alone, xs, strict=True):
            s.update(x, x)
            a.update(x, x)
            QuantStore.flush_all([a])
        QuantStore.flush_all(stores)
    for s, a in zip(stores, alone, strict=True):
        assert all(torch.equal(t, u) for t, u in zip(s.tensors(), a.tensors(), strict=True))
        assert s.nbytes() == storage_bytes(s.tensors()) == sum(t.numel() * t.element_size() for t in s.tensors())


def test_per_channel_keys_group_tokens() -> None:
    """KIVI keys: one scale per channel per group of key_group tokens; the open group waits in full precision."""
    store = QuantStore(4, None, residual=1, key_axis="channel", key_group=4)
    x = torch.randn(1, 2, 10, 8) * torch.logspace(-1, 1, 8)  # per-channel magnitudes
    store.update(x, x)
    QuantStore.flush_all([store])
    assert store.kq is not None and store.kq.scale.shape == (1, 2, 8, 2)  # (batch, heads, channels, groups)
    assert store.residual_len == 2 and store.length == 10  # 8 quantized in two groups, 1 open + 1 residual
    k, _ = store.kv()
    step = store.kq.scale.float().repeat_interleave(4, dim=-1).transpose(-1, -2)  # (1, 2, 8 tokens, 8)
    assert ((k[:, :, :8] - x[:, :, :8]).abs() <= step / 2 * (1 + 1e-5) + 1e-7).all()
    assert torch.equal(k[:, :, 8:], x[:, :, 8:])
    with pytest.raises(ValueError, match="key_axis='token'"):
        store.gather(torch.zeros(1, 2, 3, dtype=torch.long), keep_residual=True)
