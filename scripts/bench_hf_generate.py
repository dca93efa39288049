#!/usr/bin/env python3
"""transformers' `generate` on the body `skein bench` decodes, for the decode target of
docs/speed.md (skein's rollout against `generate` on the same device, batch and dtype).

The model is transformers' own Qwen2 with `skein bench`'s shape and vocabulary size, random
weights, attention through `sdpa`. Each of `--batch` sequences gets a random prompt of
`--decode-prompt` tokens and generates up to `--seq` tokens, sampling at temperature 1 with
nothing truncated (no top-k, no top-p) and no stop token, as `skein bench` decodes. One
warm-up call, then one timed call, as `scripts/bench_pytorch_eager.py` times its decode. Run
it with the flags of `skein bench`:

    .venv/bin/python scripts/bench_hf_generate.py
    python3 scripts/bench_hf_generate.py --device cuda --dtype bfloat16 --hidden 896 \\
        --layers 24 --heads 14 --kv-heads 2 --intermediate 4864 --vocab 64 --batch 64 --seq 160

`--iters` is taken for the flags' sake and not used. Needs the `transformers` package.
"""
import sys

import torch

import bench_common


def main():
    a = bench_common.parse("transformers' generate on skein bench's body")
    try:
        from transformers import Qwen2Config, Qwen2ForCausalLM
    except ImportError:
        sys.exit("bench_hf_generate: the `transformers` package is not installed (pip install transformers)")
    torch.manual_seed(0)
    dev, dtype = torch.device(a.device), getattr(torch, a.dtype)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    cfg = Qwen2Config(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads or a.heads,
        max_position_embeddings=a.seq,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"
    m = Qwen2ForCausalLM(cfg).to(dev, dtype).eval()
    params = sum(t.numel() for t in m.parameters()) / 1e6
    print(f"transformers generate: Qwen2, {params:.2f}M parameters, {a.dtype} on {dev}")
    new = a.seq - a.decode_prompt

    def generate():
        ids = torch.randint(0, a.vocab, (a.batch, a.decode_prompt), device=dev)
        with torch.no_grad():
            out = m.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new,
                pad_token_id=0,
                eos_token_id=None,
            )
        return (out.shape[1] - a.decode_prompt) * a.batch

    bench_common.print_decode_rate("transformers generate", a.batch, generate, sync)

if __name__ == "__main__":
    main()
