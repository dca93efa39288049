#!/usr/bin/env python3
"""The decode step's matrix products alone, on the body `skein bench` decodes: a bound on the
tokens per second any decode of that body can reach on this device, batch and dtype.

A decode step of a batch computes, in every layer, the query, key, value and output
projections and the three of the MLP, then the head: each a matrix product of `--batch` rows
by a weight, and together nearly all of the step's arithmetic. This times those products and
nothing else (no attention, no norms, no sampling, no cache), layer after layer with each
layer's own weights, as many steps as `skein bench` decodes (`--seq` minus
`--decode-prompt`). A decode that reaches this rate spends all its time in these products;
one at half of it spends half elsewhere. So it says how much faster than another decode (the
`generate` of `scripts/bench_hf_generate.py`) a decode could be made on this device at all.
The products are launched one by one, as an eager decode launches them: on a GPU, where a
small product's launch can outlast its arithmetic, a decode replayed from a CUDA graph pays
less for its launches and can pass this rate.
One warm-up call, then one timed call, as the decode benches time theirs. Run it with the
flags of `skein bench`:

    .venv/bin/python scripts/bench_decode_bound.py --hidden 896 --layers 24 --heads 14 \\
        --kv-heads 2 --intermediate 4864 --vocab 64 --batch 64 --seq 160

`--iters` is taken for the flags' sake and not used.
"""
import sys

import torch

import bench_common


def layer_weights(a, dev, dtype):
    """One layer's projection weights as `torch.nn.functional.linear` takes them, [out, in]."""
    head_dim = a.hidden // a.heads
    kv = (a.kv_heads or a.heads) * head_dim
    shapes = [
        (a.hidden, a.hidden),  # query
        (kv, a.hidden),  # key
        (kv, a.hidden),  # value
        (a.hidden, a.hidden),  # output
        (a.intermediate, a.hidden),  # gate
        (a.intermediate, a.hidden),  # up
        (a.hidden, a.intermediate),  # down
    ]
    return [torch.randn(out, inp, device=dev, dtype=dtype) * inp**-0.5 for out, inp in shapes]


def main():
    a = bench_common.parse("the decode step's matrix products alone, on skein bench's body")
    if a.hidden % a.heads:
        sys.exit(f"bench_decode_bound: --hidden ({a.hidden}) must be a multiple of --heads ({a.heads})")
    torch.manual_seed(0)
    dev, dtype = torch.device(a.device), getattr(torch, a.dtype)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    layers = [layer_weights(a, dev, dtype) for _ in range(a.layers)]
    head = torch.randn(a.vocab, a.hidden, device=dev, dtype=dtype) * a.hidden**-0.5
    weights = sum(w.numel() for ws in layers for w in ws) + head.numel()
    # The rows a step multiplies: one hidden state per sequence, and one MLP activation.
    x = torch.randn(a.batch, a.hidden, device=dev, dtype=dtype)
    mid = torch.randn(a.batch, a.intermediate, device=dev, dtype=dtype)
    steps = a.seq - a.decode_prompt
    linear = torch.nn.functional.linear
    print(f"decode bound: {weights / 1e6:.2f}M weights in products, {a.dtype} on {dev}")

    def decode():
        with torch.inference_mode():
            for _ in range(steps):
                for ws in layers:
                    for w in ws[:-1]:
                        linear(x, w)
                    linear(mid, ws[-1])
                linear(x, head)
        return steps * a.batch

    n, secs = bench_common.time_decode(decode, sync)
    flops = 2 * weights * n / secs
    print(f"decode bound, products alone (batch {a.batch}): {n / secs:.0f} tokens/s "
          f"({flops / 1e9:.0f} GFLOP/s; {n} tokens in {secs:.2f} s)")


if __name__ == "__main__":
    main()
