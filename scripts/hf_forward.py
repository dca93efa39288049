"""Load a model directory skein wrote with Hugging Face transformers and print its float32
logits for the token ids given as JSON on stdin ({"input_ids": [[...], ...]}), as JSON on
stdout. Used by crates/skein/tests/hf_export.rs to check that a checkpoint is loadable by
transformers and means the same thing there."""

import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
    model.eval()
    ids = torch.tensor(json.load(sys.stdin)["input_ids"])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    json.dump({"logits": logits.tolist()}, sys.stdout)


if __name__ == "__main__":
    main()
