"""What the Python reference benches share: the flags of `skein bench`, with the same defaults,
so each runs with the same command line as the bench it is compared with; and the timing of a
decode, one warm-up call and one timed call."""
import argparse
import time


def parse(description, more=None):
    """The flags of `skein bench`, and those `more(parser)` adds."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=0, help="0: as many as --heads")
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--decode-prompt", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    if more:
        more(p)
    a = p.parse_args()
    if a.seq <= a.decode_prompt:
        p.error(f"--seq ({a.seq}) must be longer than --decode-prompt ({a.decode_prompt}): decode generates the rest")
    return a


def time_decode(decode, sync):
    """Calls `decode` (which returns the tokens it generated) once to warm up, then times a
    second call, waiting for the device with `sync`: its tokens and seconds."""
    decode()
    sync()
    t = time.perf_counter()
    n = decode()
    sync()
    return n, time.perf_counter() - t


def print_decode_rate(name, batch, decode, sync):
    """Times `decode` as `time_decode` does and prints its tokens per second."""
    n, secs = time_decode(decode, sync)
    print(f"{name} (batch {batch}, KV cache): {n / secs:.0f} tokens/s ({n} tokens in {secs:.2f} s)")
