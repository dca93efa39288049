"""The flags of `skein bench` that the Python reference benches take too, with the same
defaults, so each runs with the same command line as the bench it is compared with."""
import argparse


def parse(description):
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
    return p.parse_args()
