"""The decode step's C attention kernel (engines/lean_llama/native_attention.py, decode_attention.c): values against
float64 torch at every head width, with grouped heads, masked columns, spare buffer columns and strided queries; the
lean decode step and the engine with it give the HF forward's logits and the torch path's ids; and where it cannot
be built (no compiler, a failing compiler) or gives wrong values, it is refused with the reason and torch's ops
run."""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlfleet.protocols import SamplingParams
from rlfleet.services.rollout.engines.lean_llama import native_attention
from rlfleet.services.rollout.engines.lean_llama.native_attention import HEAD_DIMS, NativeAttention
from tests.support.engine_pairs import assert_engines_agree
from tests.support.requires import requires
from tests.support.tiny_model import make_tiny_model

torch.set_num_threads(1)
CAN_RUN = native_attention._cpu_has_avx512f() and native_attention._compiler() is not None
NEEDS_KERNEL = pytest.mark.skipif(not CAN_RUN, reason="the kernel needs a CPU with AVX-512F and a C compiler")
KERNEL = NativeAttention(ctypes.CDLL(str(native_attention.build()))) if CAN_RUN else None   # unchecked: tested here


@NEEDS_KERNEL
def test_where_it_can_run_the_kernel_builds_and_passes_its_check() -> None:
    """load() refuses a kernel whose check fails; here, with AVX-512F and a compiler, it must not be refused."""
    assert native_attention.load() is not None


def _float64_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, n: int
                       ) -> torch.Tensor:
    """softmax(q Kᵀ + mask) V over the first n columns, per (row, key/value head), written out with einsum."""
    q, k, v, m = q.double(), keys[:, :, :n].double(), values[:, :, :n].double(), mask[:, 0, 0, :n].double()
    scores = torch.einsum("bhrd,bhld->bhrl", q, k) + m[:, None, None, :]
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    return torch.einsum("bhrl,bhld->bhrd", weights / weights.sum(-1, keepdim=True), v)


@NEEDS_KERNEL
@pytest.mark.parametrize("dh", HEAD_DIMS)
@pytest.mark.parametrize(("rep", "n"), [(1, 1), (1, 16), (3, 17), (2, 40)])
def test_the_kernel_equals_float64_attention(dh: int, rep: int, n: int) -> None:
    """Column counts below, at and past one 16-wide block; left-padded rows; keys and values in buffers with spare
    columns (as the decode step's slack buffers); a query that is a strided view of the rotary output."""
    assert KERNEL is not None
    g = torch.Generator().manual_seed(dh + n)
    b, hkv, spare = 5, 2, 3
    qk = torch.randn(b, hkv * rep + hkv, dh, generator=g) * dh ** -0.5             # [B, H+Hkv, Dh] as in _layer
    q = qk[:, : hkv * rep].reshape(b, hkv, rep, dh)                                # strided over rows
    keys, values = (torch.randn(b, hkv, n + spare, dh, generator=g) for _ in range(2))
    mask = torch.zeros(b, 1, 1, n)
    mask[1, ..., : n - 1] = float("-inf")                                          # only the newest column lives
    mask[2, ..., : n // 2] = float("-inf")
    got = KERNEL.attend(q, keys, values, mask, n)
    assert got.shape == (b, hkv, rep, dh) and got.dtype == torch.float32
    want = _float64_attention(q, keys, values, mask, n)
    assert torch.allclose(got.double(), want, atol=2e-6, rtol=0)
    assert torch.allclose(got[1].double(), values[1, :, n - 1].double()[:, None, :].expand(hkv, rep, dh), atol=1e-6)


@NEEDS_KERNEL
@pytest.mark.parametrize("dh", [32, 64])
def test_the_kernel_appends_the_new_key_and_value_before_reading_them(dh: int) -> None:
    """With `new` the kernel first writes each row's new key and value (strided views, as the decode step's) into
    column n - 1 and attends over it: the buffers then hold them there, other columns untouched, and the output is
    attention over the appended cache."""
    assert KERNEL is not None
    g = torch.Generator().manual_seed(dh)
    b, hkv, rep, n, spare = 4, 2, 2, 9, 3
    qkv = torch.randn(b, hkv * rep + 2 * hkv, dh, generator=g) * dh ** -0.5         # [B, H+2Hkv, Dh]
    q = qkv[:, : hkv * rep].reshape(b, hkv, rep, dh)
    k_new, v_new = qkv[:, hkv * rep: hkv * rep + hkv], qkv[:, hkv * rep + hkv:]      # [B, Hkv, Dh], strided
    keys, values = (torch.randn(b, hkv, n + spare, dh, generator=g) for _ in range(2))
    before_k, before_v = keys.clone(), values.clone()
    mask = torch.zeros(b, 1, 1, n)
    mask[3, ..., :4] = float("-inf")
    got = KERNEL.attend(q, keys, values, mask, n, (k_new, v_new))
    assert torch.equal(keys[:, :, n - 1], k_new) and torch.equal(values[:, :, n - 1], v_new)
    untouched = [c for c in range(n + spare) if c != n - 1]
    assert torch.equal(keys[:, :, untouched], before_k[:, :, untouched])
    assert torch.equal(values[:, :, untouched], before_v[:, :, untouched])
    want_k, want_v = before_k.clone(), before_v.clone()
    want_k[:, :, n - 1], want_v[:, :, n - 1] = k_new, v_new
    assert torch.allclose(got.double(), _float64_attention(q, want_k, want_v, mask, n), atol=2e-6, rtol=0)


@NEEDS_KERNEL
def test_an_unsupported_head_width_is_refused_by_the_kernel_not_read() -> None:
    assert KERNEL is not None
    q, kv = torch.zeros(1, 1, 1, 48), torch.zeros(1, 1, 4, 48)
    assert not NativeAttention.fits(q, kv, kv, torch.zeros(1, 1, 1, 4))
    with pytest.raises(RuntimeError, match="code 1"):
        KERNEL.attend(q, kv, kv, torch.zeros(1, 1, 1, 4), 4)


@NEEDS_KERNEL
def test_the_lean_decode_step_with_the_kernel_gives_the_hf_forward() -> None:
    """Grouped-query llama with 32-wide heads (6 query heads on 2 key/value heads): prefill and each decode step
    through the kernel give the HF forward's last-token logits over the whole sequence."""
    from rlfleet.services.rollout.engines.lean_llama.fast_decode import FastDecoder

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=192, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    prompts = [[1, 5, 9, 12], [1, 7], [1, 3, 3, 3, 3, 3, 8], [1, 50]]
    with torch.inference_mode():
        dec = FastDecoder(model)
        assert dec.native is not None
        prefilled = dec.prefill(prompts, torch.arange(len(prompts)), 4)
        cache, mask, logits = prefilled.cache, prefilled.mask, prefilled.logits
        seqs = [list(p) for p in prompts]
        pos = mask.sum(1)
        for _ in range(9):                                        # past the 4 spare columns: re-buffered twice
            for row, seq in enumerate(seqs):
                want = model(torch.tensor([seq])).logits[0, -1]
                assert torch.allclose(logits[row], want, atol=1e-5, rtol=0)
            last = logits.argmax(-1)
            for seq, tok in zip(seqs, last.tolist(), strict=True):
                seq.append(tok)
            mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=1)
            logits = dec.decode(cache, last, pos, mask, 4).logits
            pos = pos + 1


@NEEDS_KERNEL
def test_the_engine_with_the_kernel_gives_the_torch_paths_ids_and_logprobs(tmp_path: Path) -> None:
    """The addition example's model shape (128 wide, 4 heads of 32): greedy and seeded sampled generations of
    staggered lengths (rows finish and leave mid-batch) match the engine with torch's attention."""
    from rlfleet.services.rollout.engines.lean_llama import FastDecoder
    from rlfleet.services.rollout.engines.torch_engine import TorchEngine

    model_dir = make_tiny_model(tmp_path, seed=3, hidden=128, layers=2)
    prompts = [[1, 4, 5, 6], [1, 7], [1, 8, 9, 10, 11, 12], [1, 5, 5]]
    native, plain = (TorchEngine(model_dir, max_batch_size=4, eos_token_ids=(), native_attention=on)
                     for on in (True, False))
    try:
        assert isinstance(native._decoder, FastDecoder) and native._decoder.native is not None
        assert isinstance(plain._decoder, FastDecoder) and plain._decoder.native is None
        assert_engines_agree(native, plain, prompts, (SamplingParams(temperature=0, max_new_tokens=7),
                                                      SamplingParams(temperature=1.0, max_new_tokens=7, seed=5)),
                             lambda sampling, i: dataclasses.replace(sampling, max_new_tokens=4 + i))
    finally:
        native.shutdown()
        plain.shutdown()


def test_a_build_is_reused_from_the_cache_folder(tmp_path: Path) -> None:
    if native_attention._compiler() is None:
        pytest.skip("no C compiler on this machine")
    first = native_attention.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert native_attention.build(tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name, f"{first.name}.sha256"]   # no temporary file


def test_a_cache_folder_holding_the_build_needs_no_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if native_attention._compiler() is None:
        pytest.skip("no C compiler on this machine")
    built = native_attention.build(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CC", raising=False)
    assert native_attention._compiler() is None
    assert native_attention.build(tmp_path) == built


def test_the_temp_fallback_folder_must_be_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the cache folder cannot be written the build goes to <tmp>/rlfleet-native-<uid>; a folder of that name
    that others can write (they could plant a library there) is refused, not built into or loaded from."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))          # tempfile's documented override
    private = native_attention._private_temp_folder()
    assert private.parent == tmp_path and private.stat().st_mode & 0o777 == 0o700
    private.chmod(0o777)
    with pytest.raises(RuntimeError, match="not a private folder"):
        native_attention._private_temp_folder()


def test_without_a_compiler_the_kernel_is_off_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("RLFLEET_NATIVE_CACHE", str(tmp_path / "cache"))           # nothing built there
    monkeypatch.setenv("PATH", str(tmp_path))                                      # no cc, no gcc
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(RuntimeError, match="no C compiler"):
        native_attention.build()
    if not native_attention._cpu_has_avx512f():
        return                                                                     # load() stops at the CPU check
    with caplog.at_level(logging.WARNING):
        assert native_attention.load() is None
    assert "no C compiler" in caplog.text and "torch's ops run attention" in caplog.text


def test_a_failing_compiler_is_reported_and_leaves_nothing_behind(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "bin" / "cc-broken"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\necho 'fatal: out of cheese' >&2\nexit 4\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="failed \\(4\\): fatal: out of cheese"):
        native_attention.build(cache)
    assert list(cache.iterdir()) == []


def test_a_kernel_that_gives_wrong_values_fails_its_check() -> None:
    class OffByOne(NativeAttention):
        def __init__(self) -> None:                                                # no library: only attend
            pass

        def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, n: int,
                   new: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
            return _float64_attention(q, keys, values, mask, n).float() + (1e-3 if q.shape[-1] == 64 else 0.0)

    problem = native_attention.check(OffByOne())
    assert problem is not None and problem.startswith("head width 64:")


# ---- the cache folder is trusted only when it is this user's own and the library hashes to its recorded SHA-256 ----

PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(getenv("RLFLEET_TEST_MARKER"), "w");
    if (f) { fputs("the planted library's constructor ran", f); fclose(f); }
}
int decode_attention(void) { return 0; }
"""


def _cache_with_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder (RLFLEET_NATIVE_CACHE) holding a genuine build and its sidecar; the library's path."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("RLFLEET_NATIVE_CACHE", str(cache))
    monkeypatch.setenv("RLFLEET_TEST_MARKER", str(tmp_path / "constructor-ran"))
    return native_attention.build()


def _planted(tmp_path: Path) -> Path:
    """A library whose constructor writes the marker file: what an attacker would drop in the cache folder."""
    src = tmp_path / "planted.c"
    src.write_text(PLANTED)
    lib = tmp_path / "planted.so"
    subprocess.run([native_attention._compiler() or "cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def _refused(tmp_path: Path, caplog: pytest.LogCaptureFixture, reason: str) -> None:
    """build() refuses the cache's library naming `reason`; load() falls back to torch's ops with a warning that
    names it; the planted constructor never ran."""
    with pytest.raises(RuntimeError, match=reason):
        native_attention.build()
    if native_attention._cpu_has_avx512f():                 # load() stops earlier on a CPU without AVX-512F
        with caplog.at_level(logging.WARNING):
            assert native_attention.load() is None
        assert re.search(reason, caplog.text) and "torch's ops run attention" in caplog.text
    assert not (tmp_path / "constructor-ran").exists()


NEEDS_CC = requires(None if native_attention._compiler() else "building and planting a library needs a C compiler")


@NEEDS_CC
def test_a_planted_library_with_another_hash_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    target = _cache_with_build(tmp_path, monkeypatch)
    shutil.copyfile(_planted(tmp_path), target)             # same name, owner and mode; other bytes
    _refused(tmp_path, caplog, "has SHA-256 .* not the .* recorded")


@NEEDS_CC
def test_a_library_owned_by_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    target = _cache_with_build(tmp_path, monkeypatch)
    if os.getuid() == 0:
        os.chown(target, 1, -1)
        _refused(tmp_path, caplog, "owned by uid 1")
    else:                       # no chown without root: a cache folder root owns, as a shared mount would be
        monkeypatch.setenv("RLFLEET_NATIVE_CACHE", "/")
        _refused(tmp_path, caplog, "owned by uid 0")


@NEEDS_CC
def test_a_group_writable_library_or_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    target = _cache_with_build(tmp_path, monkeypatch)
    target.chmod(0o770)
    _refused(tmp_path, caplog, "writable by group or others")
    target.chmod(0o700)
    assert native_attention.build() == target
    target.parent.chmod(0o777)
    _refused(tmp_path, caplog, "writable by group or others")


@NEEDS_CC
def test_a_symlinked_library_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """Even to the genuine bytes: a link can be pointed elsewhere between the check and the load."""
    target = _cache_with_build(tmp_path, monkeypatch)
    elsewhere = tmp_path / "elsewhere.so"
    target.rename(elsewhere)
    target.symlink_to(elsewhere)
    _refused(tmp_path, caplog, "is a symlink")


@NEEDS_CC
def test_the_cache_folder_is_created_private_and_the_build_records_its_hash(tmp_path: Path) -> None:
    cache = tmp_path / "a" / "b"
    built = native_attention.build(cache)
    assert [p.stat().st_mode & 0o777 for p in (tmp_path / "a", cache)] == [0o700, 0o700]
    recorded = Path(f"{built}.sha256").read_text().strip()
    assert recorded == hashlib.sha256(built.read_bytes()).hexdigest()
    Path(f"{built}.sha256").unlink()                       # a build without its record is built again, not trusted
    assert native_attention.build(cache) == built and Path(f"{built}.sha256").exists()
