#!/usr/bin/env python3
"""Build tiny random Hugging Face checkpoints and the logits transformers computes for them.

The Rust decoder (crates/skein) loads these directories and must reproduce `expected.json`,
so the fixtures pin our implementation to the reference one for Qwen2 (attention bias, untied
head), Qwen3 (q/k RMSNorm, explicit head_dim) and Llama (no bias, tied embeddings), and check
that sharded checkpoints (model.safetensors.index.json) load the same as single files.
tiny-llama-rope3 sets what the others leave at their defaults (rope_theta 5e5, rms_norm_eps
1e-5, a head_dim other than hidden/heads, Llama 3 rope scaling over a sequence longer than its
original context) in the layout published Llama 3 checkpoints use: rope_theta and rope_scaling
at the top level, no rope_parameters.

Run with the project venv (torch, transformers, safetensors, numpy):
    .venv/bin/python scripts/make_tiny_hf_fixture.py [--out crates/skein/tests/fixtures]

expected.json:
    input_ids:        [2][12] int, the batch fed to the model (no padding, no attention mask)
    last_positions:   [3] int, the positions whose logits are stored (9, 10, 11)
    logits_last:      [2][3][vocab] float32 (shortest exact decimal), logits at those positions
    argmax:           [2][12] int, argmax of the logits at every position
    dtype, attn_implementation, transformers_version, torch_version: provenance
"""

import argparse
import inspect
import json
import os
import shutil

import numpy as np
import torch
import transformers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

SEED = 1234
VOCAB = 128
SEQ_LEN = 12
LAST = 3

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def models():
    yield "tiny-qwen2", Qwen2ForCausalLM, Qwen2Config(**COMMON, tie_word_embeddings=False)
    yield "tiny-qwen3", Qwen3ForCausalLM, Qwen3Config(
        **COMMON, head_dim=16, tie_word_embeddings=False, attention_bias=False
    )
    yield "tiny-llama", LlamaForCausalLM, LlamaConfig(
        **COMMON, tie_word_embeddings=True, attention_bias=False, mlp_bias=False
    )
    rope3 = dict(COMMON, rope_theta=500000.0, rms_norm_eps=1e-5)
    rope3["rope_parameters"] = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        # Shorter than the 12-token input, so the scaled frequencies matter.
        "original_max_position_embeddings": 8,
    }
    yield "tiny-llama-rope3", LlamaForCausalLM, LlamaConfig(
        **rope3, head_dim=16, tie_word_embeddings=False, attention_bias=False, mlp_bias=False
    )


def legacy_rope_layout(out_dir):
    # Published Llama 3 configs (transformers 4) keep rope_theta and rope_scaling at the top
    # level; transformers 5 reads them into rope_parameters.
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    params = dict(config.pop("rope_parameters"))
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = params
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def fixed_input_ids():
    g = torch.Generator().manual_seed(SEED + 1)
    # Avoid the special ids 0..3 so the batch is plain content.
    return torch.randint(4, VOCAB, (2, SEQ_LEN), generator=g)


def f32_list(t):
    # Shortest decimal that parses back to the same float32: exact, and half the bytes of the
    # float64 repr json.dump would write.
    return [[[float(str(np.float32(v))) for v in row] for row in seq] for seq in t.numpy()]


def save(model, out_dir, **kwargs):
    # transformers 4.x takes safe_serialization; 5.x always writes safetensors.
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, **kwargs)


def randomize(model):
    # The default init leaves RMSNorm weights at 1 and biases at 0: perturb every parameter so
    # that a wrong norm, a dropped bias or a swapped tensor changes the logits.
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def add_legacy_rope_theta(out_dir):
    # transformers 5 nests rope_theta under rope_parameters; most published checkpoints carry
    # it at the top level. Write both so the fixture covers the layout loaders meet most.
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.setdefault("rope_theta", config.get("rope_parameters", {}).get("rope_theta", 10000.0))
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def build(name, cls, config, out_root, shard=False):
    torch.manual_seed(SEED)
    config._attn_implementation = "eager"
    model = cls(config).to(torch.float32).eval()
    randomize(model)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    ids = fixed_input_ids()
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()

    out_dir = os.path.join(out_root, name)
    save(model, out_dir)
    if name.endswith("rope3"):
        legacy_rope_layout(out_dir)
    else:
        add_legacy_rope_theta(out_dir)
    GenerationConfig(
        bos_token_id=1, eos_token_id=[2, 3], pad_token_id=0, do_sample=True, temperature=0.7, top_p=0.9
    ).save_pretrained(out_dir)
    expected = {
        "input_ids": ids.tolist(),
        "last_positions": list(range(SEQ_LEN - LAST, SEQ_LEN)),
        "logits_last": f32_list(logits[:, -LAST:, :]),
        "argmax": logits.argmax(-1).tolist(),
        "dtype": "float32",
        "attn_implementation": "eager",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
    }
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")

    # Reload from disk and compare, so the fixture is known to round-trip through safetensors.
    reloaded = cls.from_pretrained(out_dir, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        again = reloaded(input_ids=ids).logits.float()
    assert torch.allclose(again, logits, atol=1e-6), name

    if shard:
        sharded_dir = out_dir + "-sharded"
        save(model, sharded_dir, max_shard_size="20KB")
        add_legacy_rope_theta(sharded_dir)
        shutil.copy(os.path.join(out_dir, "expected.json"), sharded_dir)
        GenerationConfig.from_pretrained(out_dir).save_pretrained(sharded_dir)
        files = sorted(os.listdir(sharded_dir))
        assert "model.safetensors.index.json" in files, files
        assert sum(f.endswith(".safetensors") for f in files) > 1, files
        reloaded = cls.from_pretrained(sharded_dir, attn_implementation="eager", dtype=torch.float32)
        with torch.no_grad():
            again = reloaded.eval()(input_ids=ids).logits.float()
        assert torch.allclose(again, logits, atol=1e-6), sharded_dir
    print(f"{name}: logits {tuple(logits.shape)} -> {out_dir}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "crates", "skein", "tests", "fixtures")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--only", help="build this fixture alone")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    for name, cls, config in models():
        if args.only in (None, name):
            build(name, cls, config, args.out, shard=(name == "tiny-qwen2"))


if __name__ == "__main__":
    main()
