#!/usr/bin/env python3
"""PyTorch eager reference for `skein bench`: the same model size, the same training step
(forward log-probs, clipped PPO loss, backward, AdamW) and KV-cached decode at the same batch,
driven from Python. Run it right after `skein bench` on the same machine to get ratios:

    .venv/bin/python scripts/bench_pytorch_eager.py
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, h, heads, inter):
        super().__init__()
        self.heads, self.hd = heads, h // heads
        self.n1 = torch.nn.RMSNorm(h, eps=1e-6)
        self.n2 = torch.nn.RMSNorm(h, eps=1e-6)
        self.q = torch.nn.Linear(h, h)
        self.k = torch.nn.Linear(h, h)
        self.v = torch.nn.Linear(h, h)
        self.o = torch.nn.Linear(h, h, bias=False)
        self.gate = torch.nn.Linear(h, inter, bias=False)
        self.up = torch.nn.Linear(h, inter, bias=False)
        self.down = torch.nn.Linear(inter, h, bias=False)

    def attn(self, x, cos, sin, cache):
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, self.heads, self.hd).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if cache is not None:
            if cache:
                k = torch.cat([cache[0], k], 2)
                v = torch.cat([cache[1], v], 2)
            cache[:] = [k, v]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
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
    def __init__(self, vocab, h, layers, heads, inter, max_pos):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, h)
        self.blocks = torch.nn.ModuleList(Block(h, heads, inter) for _ in range(layers))
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--decode-prompt", type=int, default=16)
    a = p.parse_args()
    torch.manual_seed(0)
    m = Model(a.vocab, a.hidden, a.layers, a.heads, a.intermediate, a.seq)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    prompt = a.seq // 4
    adv = torch.ones(a.batch, a.seq - 1)
    old = torch.full((a.batch, a.seq - 1), -6.0)
    mask = torch.zeros(a.batch, a.seq - 1)
    mask[:, prompt - 1 :] = 1
    times = []
    for i in range(a.iters + 1):
        t = time.perf_counter()
        opt.zero_grad()
        logp = m(ids)[:, :-1].log_softmax(-1).gather(2, ids[:, 1:, None]).squeeze(2)
        ratio = (logp - old).exp()
        loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
        loss = (loss * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if i:
            times.append(time.perf_counter() - t)
    print(f"pytorch eager train step (batch {a.batch} x {a.seq} tokens): {statistics.median(times) * 1e3:.1f} ms")

    def decode():
        caches = [[] for _ in m.blocks]
        x = torch.randint(0, a.vocab, (a.batch, a.decode_prompt))
        n = 0
        with torch.no_grad():
            logits = m(x, 0, caches)[:, -1]
            pos = a.decode_prompt
            while pos < a.seq:
                probs = logits.log_softmax(-1).exp()
                tok = torch.multinomial(probs, 1)
                n += a.batch
                logits = m(tok, pos, caches)[:, -1]
                pos += 1
        return n

    decode()
    t = time.perf_counter()
    n = decode()
    secs = time.perf_counter() - t
    print(f"pytorch eager decode (batch {a.batch}, KV cache): {n / secs:.0f} tokens/s ({n} tokens in {secs:.2f} s)")


if __name__ == "__main__":
    main()
