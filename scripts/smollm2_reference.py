"""What Hugging Face transformers makes of a model directory, for skein's parity tests on a
real pretrained model (crates/skein/tests/smollm2.rs):

    smollm2_reference.py MODEL_DIR < request.json > answer.json

The request is a JSON object; each key is optional:
  "render":   conversations, each {"messages": [...], "tools": [...] or null,
              "add_generation_prompt": bool}, rendered with the tokenizer's chat template
              (`apply_chat_template(..., tokenize=False)`) and encoded without special tokens;
  "forward":  token id lists, whose float32 logits [T, vocab] are written to the safetensors
              file "logits_out" as tensors "0", "1", ... (one per list, no padding);
  "generate": token id lists, each continued greedily (`generate(do_sample=False)`) by at most
              "max_new_tokens" tokens (default 16), stopping at the generation config's eos.
The answer is {"rendered": [text...], "ids": [[id...]...], "generated": [[id...]...]}, the
generated ids without their prompt. The model is only loaded when "forward" or "generate" is
given."""

import json
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    model_dir = sys.argv[1]
    request = json.load(sys.stdin)
    answer = {"rendered": [], "ids": [], "generated": []}

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for chat in request.get("render", []):
        text = tokenizer.apply_chat_template(
            chat["messages"],
            tools=chat.get("tools"),
            add_generation_prompt=chat["add_generation_prompt"],
            tokenize=False,
        )
        answer["rendered"].append(text)
        answer["ids"].append(tokenizer(text, add_special_tokens=False)["input_ids"])

    if request.get("forward") or request.get("generate"):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.eval()
        with torch.no_grad():
            logits = {
                str(i): model(input_ids=torch.tensor([ids])).logits[0].contiguous()
                for i, ids in enumerate(request.get("forward", []))
            }
            if logits:
                save_file(logits, request["logits_out"])
            for ids in request.get("generate", []):
                prompt = torch.tensor([ids])
                out = model.generate(
                    prompt,
                    attention_mask=torch.ones_like(prompt),
                    do_sample=False,
                    max_new_tokens=request.get("max_new_tokens", 16),
                )
                answer["generated"].append(out[0, prompt.shape[1] :].tolist())

    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
