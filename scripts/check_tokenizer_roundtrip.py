#!/usr/bin/env python3
"""Record what Python transformers does with skein's tokenizer fixtures.

For each directory under crates/skein-text/tests/fixtures/ this loads the tokenizer with
`AutoTokenizer.from_pretrained(dir)` and with `PreTrainedTokenizerFast(tokenizer_file=...)`,
checks the two agree, and writes `expected.json` there: the ids and decodings of a few strings
and the rendered text and ids of a few chats. The Rust test `tests/python_parity.rs` compares
`skein_text::Tokenizer` against that file, so CI (which has no transformers) still checks the
Rust side against Python.

- `char-level/` is written by Rust (`Tokenizer::char_level`, see python_parity.rs); this
  script only reads it.
- `bpe-bytelevel/` is made here: a small byte-level BPE trained on a few sentences with a
  Qwen2-style split regex, and a ChatML template with tool support, so the parity check covers
  the regex features (lookahead, Unicode classes) and template features real checkpoints use.
- `bpe-bos/` is made here too: the same BPE with a Llama-style post-processor that puts a BOS
  before every text, and no chat template, as a base Llama, Mistral or Gemma checkpoint has.
- `bpe-bos-off/` is `bpe-bos/` with `"add_bos_token": false` in tokenizer_config.json. The
  post-processor of tokenizer.json decides: transformers (5.x) still puts the BOS first, and so
  does skein, which reads only the post-processor.

Run with the project venv (transformers, tokenizers):
    .venv/bin/python scripts/check_tokenizer_roundtrip.py

expected.json:
    cases: [{text, ids, prompt_ids, decoded, decoded_skip_special}]
        (ids: without special tokens; prompt_ids: `tokenizer(text)`, the post-processor's too)
    chats: [{messages, tools?, add_generation_prompt, text, ids}] (none without a template)
    transformers_version, tokenizers_version
"""

import json
import os

import tokenizers
import transformers
from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "crates", "skein-text", "tests", "fixtures")

# Splits like the GPT-4-style pretokenizers of Qwen2 models: contractions, letter runs,
# single digits, punctuation runs, newline runs, and trailing spaces kept apart by lookahead.
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CORPUS = [
    "The agent reads the task, calls a tool, and answers.",
    "Rewards come from programs; advantages are computed per group.",
    "Tokens in, tokens out: the ids the policy sampled are the ids we train on.",
    "What is 12 + 30? The answer is 42.",
    "Ein kleiner Satz über Käse und Brötchen.",
    "Une réponse courte, s'il vous plaît.",
    "简单的中文句子。",
    "def add(a, b):\n    return a + b\n",
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML with tools: the system turn lists tool schemas as JSON lines, assistant tool calls are
# JSON inside <tool_call> tags, and consecutive tool results share one user turn.
BPE_TEMPLATE = """{%- set sys = messages[0].content if messages and messages[0].role == 'system' else 'You are a careful assistant.' %}
{{- '<|im_start|>system\\n' + sys }}
{%- if tools %}
{{- '\\n\\n## Tools\\nCall a tool by writing <tool_call>{"name": ..., "arguments": ...}</tool_call>. Available:\\n' }}
{%- for tool in tools %}
{{- tool | tojson + '\\n' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}{{- raise_exception('system message must come first') }}{%- endif %}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content.strip() + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content }}
{%- for call in message.tool_calls or [] %}
{%- set fn = call.function if call.function is defined else call %}
{{- '\\n<tool_call>\\n' + {'name': fn.name, 'arguments': fn.arguments} | tojson + '\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

TEXTS = [
    "hello world",
    "12+30=42",
    "what is 7*6? it is 42.",
    "Unknown: ÉÉ and tabs\tand ~ tilde",
    "<|im_start|>user\nhi<|im_end|>\n",
    "  leading and trailing spaces   ",
    "line one\n\nline two\n",
    "don't stop; we'll see — Käse 简单 🙂",
    "numbers 1234567 and code: return a + b",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]

CHATS = [
    {"messages": [{"role": "user", "content": "what is 2+2?"}], "add_generation_prompt": True},
    {
        "messages": [
            {"role": "system", "content": "answer with a number."},
            {"role": "user", "content": "what is 3*4?"},
            {"role": "assistant", "content": "12"},
        ],
        "add_generation_prompt": False,
    },
]

TOOL_CHAT = {
    "messages": [
        {"role": "user", "content": "Add 1 and 2, then 3 and 4."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": {"b": 2, "a": 1}}},
                {"type": "function", "function": {"name": "add", "arguments": {"b": 4, "a": 3}}},
            ],
        },
        {"role": "tool", "content": " 3 "},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "3 and 7 (é ✓)"},
    ],
    "tools": TOOLS,
    "add_generation_prompt": True,
}


def byte_level_bpe(corpus, vocab_size, specials=SPECIALS):
    """A byte-level BPE tokenizer in Qwen2's layout (its split regex, then bytes), with
    `specials`, trained on `corpus`."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def build_bpe(out_dir):
    tok = byte_level_bpe(CORPUS * 3, 400)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": BPE_TEMPLATE,
    }
    write_json(os.path.join(out_dir, "tokenizer_config.json"), config, indent=2)
    eot = tok.token_to_id("<|endoftext|>")
    im_end = tok.token_to_id("<|im_end|>")
    write_json(os.path.join(out_dir, "generation_config.json"), {"eos_token_id": [im_end, eot]}, indent=2)


def build_bpe_bos(out_dir, add_bos_token=None):
    tok = byte_level_bpe(CORPUS * 3, 400, ["<unk>", "<s>", "</s>"])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }
    if add_bos_token is not None:
        config["add_bos_token"] = add_bos_token
    write_json(os.path.join(out_dir, "tokenizer_config.json"), config, indent=2)


def write_json(path, value, indent=None):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=indent)
        f.write("\n")


def record(dir_name, chats):
    d = os.path.join(FIXTURES, dir_name)
    auto = AutoTokenizer.from_pretrained(d)
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"))
    cases = []
    for text in TEXTS:
        ids = auto.encode(text, add_special_tokens=False)
        assert ids == fast.encode(text, add_special_tokens=False), (dir_name, text)
        prompt_ids = auto(text)["input_ids"]
        assert prompt_ids == fast(text)["input_ids"], (dir_name, text)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "prompt_ids": prompt_ids,
                "decoded": auto.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": auto.decode(ids, skip_special_tokens=True),
            }
        )
    rendered = []
    for chat in chats:
        text = auto.apply_chat_template(
            chat["messages"],
            tools=chat.get("tools"),
            add_generation_prompt=chat["add_generation_prompt"],
            tokenize=False,
        )
        rendered.append({**chat, "text": text, "ids": auto.encode(text, add_special_tokens=False)})
    write_json(
        os.path.join(d, "expected.json"),
        {
            "transformers_version": transformers.__version__,
            "tokenizers_version": tokenizers.__version__,
            "cases": cases,
            "chats": rendered,
        },
    )
    unk = auto.unk_token_id
    print(f"{dir_name}: vocab {len(auto)}, unk {unk}, eos {auto.eos_token!r}, {len(cases)} texts, {len(rendered)} chats")
    for case in cases[:3]:
        print(f"  {case['text']!r} -> {case['ids']}")


def main():
    build_bpe(os.path.join(FIXTURES, "bpe-bytelevel"))
    build_bpe_bos(os.path.join(FIXTURES, "bpe-bos"))
    build_bpe_bos(os.path.join(FIXTURES, "bpe-bos-off"), add_bos_token=False)
    record("char-level", CHATS)
    record("bpe-bytelevel", CHATS + [TOOL_CHAT])
    record("bpe-bos", [])
    record("bpe-bos-off", [])


if __name__ == "__main__":
    main()
