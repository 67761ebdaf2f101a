"""The torch engine's lean Llama-family path (llama, qwen2, mistral without sliding window), one door: what the
engine imports is what this module exports.

`FastDecoder` is a Decoder (engines/decoder.py) with the HF modules' math in fewer ops: q/k/v and gate/up fused into
one matmul each over the modules' own memory (fused_params.py), a packed prefill over the prompts' real tokens
(fast_prefill.py), a decode step of ~18 ops a layer appending into slack-padded cache buffers (fast_decode.py), the
matmuls behind a `Linears` (llama_ops.py), and decode attention as a C kernel (native_attention.py,
decode_attention.c). `supports(model)` says whether a model qualifies; the engine picks it when the model loads
(`perf.engine_fast_decode`, not on-policy, no MoE routes to record).

Where it pays: on a CPU, where a small model's step is per-op overhead and the matmul library matters, all of it
(oneDNN linears, feature-major BLAS, the AVX-512 attention kernel, few spare cache columns). On a GPU the fused
matmuls, the packed prefill, the in-place cache append and the one-copy row removal apply (spare columns up to
SLACK); the oneDNN linears and the C attention kernel are CPU-only and switch themselves off there.
"""

from rlfleet.services.rollout.engines.lean_llama.fast_decode import FastDecoder, supports

__all__ = ["FastDecoder", "supports"]
