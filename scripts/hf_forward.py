"""Load a model directory skein wrote with Hugging Face transformers and print its float32
logits for the token ids given as JSON on stdin ({"input_ids": [[...], ...]}), as JSON on
stdout. Used by crates/skein/tests/hf_export.rs to check that a checkpoint is loadable by
transformers and means the same thing there.

With a second argument, a LoRA adapter directory in PEFT's layout is applied on top (with
the `peft` package); with a third, PEFT saves the adapter it loaded there again, so skein can
check it reads what PEFT writes."""

import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
    if len(sys.argv) > 2:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, sys.argv[2])
        if len(sys.argv) > 3:
            model.save_pretrained(sys.argv[3])
    model.eval()
    ids = torch.tensor(json.load(sys.stdin)["input_ids"])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    json.dump({"logits": logits.tolist()}, sys.stdout)


if __name__ == "__main__":
    main()
