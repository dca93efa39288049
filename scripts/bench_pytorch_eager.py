#!/usr/bin/env python3
"""PyTorch eager reference for `skein bench`: the same model size, the same training step
(forward log-probs, clipped PPO loss, backward, AdamW) and KV-cached decode at the same batch,
driven from Python. Run it right after `skein bench` on the same machine, with the same
flags, to get ratios:

    .venv/bin/python scripts/bench_pytorch_eager.py
    python3 scripts/bench_pytorch_eager.py --device cuda --dtype bfloat16 --hidden 896 \
        --layers 24 --heads 14 --kv-heads 2 --intermediate 4864 --batch 64 --seq 160

`--device` and `--dtype` place the whole model (eager trains every weight in that dtype);
`--kv-heads` gives grouped-query attention as `skein bench --kv-heads` does. With
`--master-weights` AdamW updates float32 copies of the weights, as `skein bench --dtype
bfloat16` does with every weight trained: the gradients are copied to float32 and the updated
copies back to the weights, each list in one multi-tensor copy.
"""
import statistics
import time

import torch
import torch.nn.functional as F

import bench_common


class Block(torch.nn.Module):
    def __init__(self, h, heads, kv_heads, inter):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, h // heads
        self.n1 = torch.nn.RMSNorm(h, eps=1e-6)
        self.n2 = torch.nn.RMSNorm(h, eps=1e-6)
        self.q = torch.nn.Linear(h, h)
        self.k = torch.nn.Linear(h, kv_heads * self.hd)
        self.v = torch.nn.Linear(h, kv_heads * self.hd)
        self.o = torch.nn.Linear(h, h, bias=False)
        self.gate = torch.nn.Linear(h, inter, bias=False)
        self.up = torch.nn.Linear(h, inter, bias=False)
        self.down = torch.nn.Linear(inter, h, bias=False)

    def attn(self, x, cos, sin, cache):
        b, t, _ = x.shape
        split = lambda y, n: y.view(b, t, n, self.hd).transpose(1, 2)
        q = split(self.q(x), self.heads)
        k, v = split(self.k(x), self.kv_heads), split(self.v(x), self.kv_heads)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if cache is not None:
            if cache:
                k = torch.cat([cache[0], k], 2)
                v = torch.cat([cache[1], v], 2)
            cache[:] = [k, v]
        gqa = self.heads != self.kv_heads
        out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=gqa)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x, cos, sin, cache=None):
        x = x + self.attn(self.n1(x), cos, sin, cache)
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class Model(torch.nn.Module):
    def __init__(self, vocab, h, layers, heads, kv_heads, inter, max_pos):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, h)
        self.blocks = torch.nn.ModuleList(Block(h, heads, kv_heads, inter) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(h, eps=1e-6)
        hd = h // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(max_pos).float(), inv)
        ang = torch.cat([ang, ang], -1)
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())

    def forward(self, ids, start=0, caches=None):
        t = ids.shape[1]
        cos, sin = self.cos[start : start + t], self.sin[start : start + t]
        x = self.embed(ids)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, None if caches is None else caches[i])
        return self.norm(x) @ self.embed.weight.T


def master_weights_flag(p):
    p.add_argument(
        "--master-weights",
        action="store_true",
        help="AdamW on float32 copies of the weights (mixed precision)",
    )


def main():
    a = bench_common.parse("PyTorch eager reference for skein bench", master_weights_flag)
    torch.manual_seed(0)
    dev, dtype = torch.device(a.device), getattr(torch, a.dtype)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    kv = a.kv_heads or a.heads
    m = Model(a.vocab, a.hidden, a.layers, a.heads, kv, a.intermediate, a.seq).to(dev, dtype)
    masters = "float32 master weights, " if a.master_weights else ""
    print(f"pytorch eager: {sum(p.numel() for p in m.parameters()) / 1e6:.2f}M parameters, {a.dtype} on {dev}, {masters}every weight trained")
    params = list(m.parameters())
    # Mixed precision: AdamW steps float32 copies, whose gradients are allocated once.
    stepped = [p.detach().float() for p in params] if a.master_weights else params
    if a.master_weights:
        for w in stepped:
            w.grad = torch.empty_like(w)
    opt = torch.optim.AdamW(stepped, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    prompt = a.seq // 4
    adv = torch.ones(a.batch, a.seq - 1, device=dev)
    old = torch.full((a.batch, a.seq - 1), -6.0, device=dev)
    mask = torch.zeros(a.batch, a.seq - 1, device=dev)
    mask[:, prompt - 1 :] = 1
    times = []
    for i in range(a.iters + 1):
        t = time.perf_counter()
        m.zero_grad()
        logits = m(ids)[:, :-1].float()
        logp = logits.log_softmax(-1).gather(2, ids[:, 1:, None]).squeeze(2)
        ratio = (logp - old).exp()
        loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
        loss = (loss * mask).sum() / mask.sum()
        loss.backward()
        if a.master_weights:
            torch._foreach_copy_([w.grad for w in stepped], [p.grad for p in params])
        torch.nn.utils.clip_grad_norm_(stepped, 1.0)
        opt.step()
        if a.master_weights:
            with torch.no_grad():
                torch._foreach_copy_(params, stepped)
        sync()
        if i:
            times.append(time.perf_counter() - t)
    step = statistics.median(times)
    print(
        f"pytorch eager train step (batch {a.batch} x {a.seq} tokens): {step * 1e3:.1f} ms, "
        f"{a.batch * a.seq / step:.0f} tokens/s"
    )

    def decode():
        caches = [[] for _ in m.blocks]
        x = torch.randint(0, a.vocab, (a.batch, a.decode_prompt), device=dev)
        n = 0
        with torch.no_grad():
            logits = m(x, 0, caches)[:, -1]
            pos = a.decode_prompt
            while pos < a.seq:
                probs = logits.float().log_softmax(-1).exp()
                tok = torch.multinomial(probs, 1)
                n += a.batch
                logits = m(tok, pos, caches)[:, -1]
                pos += 1
        return n

    bench_common.print_decode_rate("pytorch eager decode", a.batch, decode, sync)

if __name__ == "__main__":
    main()
