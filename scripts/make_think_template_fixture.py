#!/usr/bin/env python3
"""Build a tokenizer whose chat template drops earlier reasoning, and record what transformers
renders for a fixed multi-turn conversation at each of its turns.

Reasoning models' templates (Qwen3's among them) render an assistant message that a user or
tool message follows without its `<think>…</think>` block, so the prompt of turn k+1 does not
extend turn k's prompt and sampled ids: such an episode trains step-wise, one row per turn.
The Rust test `trainer::rollout::episodes` plays this conversation through the agent loop and
checks that the ids the model is given at each turn are exactly the ids recorded here, i.e. what
the model would see at inference.

The directory `crates/skein/tests/fixtures/think-template/` holds:
- tokenizer.json: a small byte-level BPE (Qwen2-style split regex) trained on the conversation,
  with `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` as special tokens and `<think>`,
  `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>` as added
  tokens that are not special (they survive decoding, as in Qwen3's tokenizer);
- tokenizer_config.json: eos `<|im_end|>` and the Qwen3-style chat template below;
- generation_config.json: the stop ids;
- expected.json:
    messages: the conversation (user, then assistant/reply pairs, the last assistant message
        ending it)
    chatml_template: a plain ChatML template (append-only: every turn extends the last)
    turns: {"think": [...], "chatml": [...]}, one entry per assistant message:
        prompt_text, prompt_ids: `apply_chat_template(messages before it,
            add_generation_prompt=True)` with that template
        completion_ids: the message's ids followed by `<|im_end|>` (what a model samples)
        extends: whether prompt_ids starts with the previous turn's prompt_ids and
            completion_ids (false on every later turn of "think", true on every one of "chatml")
    transformers_version, tokenizers_version

Run with the project venv (transformers, tokenizers):
    .venv/bin/python scripts/make_think_template_fixture.py
"""

import json
import os
import sys

import tokenizers
import transformers
from tokenizers import AddedToken
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from check_tokenizer_roundtrip import byte_level_bpe, write_json  # noqa: E402

OUT = os.path.join(HERE, "..", "crates", "skein", "tests", "fixtures", "think-template")

# Added tokens that decode as text, as in Qwen3's tokenizer.
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# Qwen3's layout: `<|im_start|>role\n…<|im_end|>\n` turns, tool results as `<tool_response>`
# blocks inside a user turn (consecutive ones share it), and an assistant message that a user or
# tool message follows rendered with its content after `</think>` only (leading newlines
# dropped): earlier reasoning is not shown to the model again.
THINK_TEMPLATE = """{%- set ns = namespace(last_reply=-1) %}
{%- for message in messages %}
{%- if message.role == 'user' or message.role == 'tool' %}{%- set ns.last_reply = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'system' or message.role == 'user' %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{%- set content = message.content %}
{%- if loop.index0 < ns.last_reply and '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

# The same layout keeping every message as written: each turn extends the last.
CHATML_TEMPLATE = """{%- for message in messages %}
{%- if message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

# The model thinks, calls a tool, reads its result, answers, and is asked again.
MESSAGES = [
    {"role": "user", "content": "What is 6 times 7? Use the calculator."},
    {
        "role": "assistant",
        "content": '<think>\nI should call the tool.\n</think>\n\n<tool_call>\n'
        '{"name": "calc", "arguments": {"expr": "6*7"}}\n</tool_call>',
    },
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "<think>\nThe tool says 42.\n</think>\n\nThe answer is 42."},
    {"role": "user", "content": "Are you sure?"},
    {"role": "assistant", "content": "<think>\nYes: 6*7 is 42.\n</think>\n\nYes, it is 42."},
]


def build_tokenizer():
    corpus = [m["content"] for m in MESSAGES] + ["user assistant system tool"]
    tok = byte_level_bpe(corpus * 3, 300)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    os.makedirs(OUT, exist_ok=True)
    tok.save(os.path.join(OUT, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": THINK_TEMPLATE,
    }
    write_json(os.path.join(OUT, "tokenizer_config.json"), config, indent=2)
    ids = [tok.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>")]
    write_json(os.path.join(OUT, "generation_config.json"), {"eos_token_id": ids}, indent=2)


def turns(tok, template):
    """Each assistant message's prompt (the messages before it, rendered with the assistant
    opener) and ids, as apply_chat_template gives them."""
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    out = []
    for i, m in enumerate(MESSAGES):
        if m["role"] != "assistant":
            continue
        history = MESSAGES[:i]
        text = tok.apply_chat_template(
            history, chat_template=template, add_generation_prompt=True, tokenize=False
        )
        ids = tok.apply_chat_template(
            history, chat_template=template, add_generation_prompt=True, tokenize=True,
            return_dict=False,
        )
        assert ids == tok.encode(text, add_special_tokens=False), text
        completion = tok.encode(m["content"], add_special_tokens=False) + [im_end]
        assert tok.decode(completion, skip_special_tokens=True) == m["content"]
        extends = None
        if out:
            before = out[-1]["prompt_ids"] + out[-1]["completion_ids"]
            extends = ids[: len(before)] == before
        out.append(
            {"prompt_text": text, "prompt_ids": ids, "completion_ids": completion, "extends": extends}
        )
    return out


def main():
    build_tokenizer()
    tok = AutoTokenizer.from_pretrained(OUT)
    think = turns(tok, THINK_TEMPLATE)
    chatml = turns(tok, CHATML_TEMPLATE)
    # What the fixture is for: one template re-renders earlier turns, the other extends them.
    assert [t["extends"] for t in think[1:]] == [False] * (len(think) - 1)
    assert [t["extends"] for t in chatml[1:]] == [True] * (len(chatml) - 1)
    assert "I should call" not in think[-1]["prompt_text"]
    assert "I should call" in chatml[-1]["prompt_text"]
    write_json(
        os.path.join(OUT, "expected.json"),
        {
            "transformers_version": transformers.__version__,
            "tokenizers_version": tokenizers.__version__,
            "messages": MESSAGES,
            "chatml_template": CHATML_TEMPLATE,
            "turns": {"think": think, "chatml": chatml},
        },
    )
    print(f"think-template: vocab {len(tok)}, {len(think)} turns")
    for name, ts in (("think", think), ("chatml", chatml)):
        print(f"  {name}: prompt lengths {[len(t['prompt_ids']) for t in ts]}")


if __name__ == "__main__":
    main()
