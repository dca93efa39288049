"""Greedy accuracy on all 100 difficulty-1 problems (and optional sampled accuracy), same scoring
as skein's arithmetic task. Usage: greedy_eval.py MODEL_DIR [--sample N]"""
import sys, json
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(2)
path = sys.argv[1]
n_sample = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--sample" else 0
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
probs = [(a, b) for a in range(10) for b in range(10)]
enc = torch.tensor([tok(f"{a}+{b}=")["input_ids"] for a, b in probs])  # all 4 tokens


def run(do_sample, reps):
    ids = enc.repeat_interleave(reps, 0)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=do_sample,
                             temperature=1.0 if do_sample else None, top_k=0 if do_sample else None, top_p=1.0,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
    gts = [str(a + b) for a, b in probs for _ in range(reps)]
    return sum(t.strip() == g for t, g in zip(texts, gts)) / len(gts)


res = {"model": path, "greedy_acc": run(False, 1)}
if n_sample:
    torch.manual_seed(0)
    res["sampled_acc"] = run(True, n_sample)
print(json.dumps(res))
