"""TRL's GRPOTrainer on skein's `arithmetic` difficulty-1 task, set to match the skein run of
docs/trl-comparison.md, started from the same skein checkpoint.

One TRL generation of 32 prompts x 8 samples is one skein step, consumed by two optimizer steps
of 128 completions (steps_per_generation=2). `loss_type="bnpo"` is skein's token-mean over the
mini-batch; `delta=3` caps the ratio as skein's dual clip 3 does. The training reward of each
generation is written to OUT/rewards.jsonl by the reward function.
"""
import argparse, json, os, random, sys, time

import torch

p = argparse.ArgumentParser()
p.add_argument("--model", required=True, help="skein warm-up checkpoint (HF layout)")
p.add_argument("--out", required=True)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--steps", type=int, default=60, help="generation steps (skein steps)")
p.add_argument("--loss_type", default="bnpo")
p.add_argument("--delta", type=float, default=3.0, help="upper bound on ratio = dual clip; <=0 disables")
p.add_argument("--adv_eps", type=float, default=None, help="replace TRL's 1e-4 advantage epsilon")
p.add_argument("--lr", type=float, default=5e-4)
p.add_argument("--beta2", type=float, default=0.99)
p.add_argument("--grad_clip", type=float, default=1.0)
p.add_argument("--spg", type=int, default=2, help="steps_per_generation (mini-batches per step)")
p.add_argument("--threads", type=int, default=2)
args = p.parse_args()

torch.set_num_threads(args.threads)
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
import trl
import trl.trainer.grpo_trainer as gt
from trl import GRPOConfig, GRPOTrainer

if args.adv_eps is not None:
    # TRL adds 1e-4 to the group std; shift the std so that std + 1e-4 == std + adv_eps.
    _orig = gt.nanstd
    shift = args.adv_eps - 1e-4
    gt.nanstd = lambda *a, **k: _orig(*a, **k) + shift

os.makedirs(args.out, exist_ok=True)
rng = random.Random(args.seed)
n_prompts = args.steps * 32 + 64
rows = []
for _ in range(n_prompts):
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
ds = Dataset.from_list(rows)

log_path = os.path.join(args.out, "rewards.jsonl")
logf = open(log_path, "w")
state = {"gen": 0, "t0": time.time()}


def reward_fn(prompts, completions, answer, **kw):
    # skein: drop stop tokens, decode skipping special tokens, trim, exact match.
    r = [1.0 if c.strip() == gt_ans else 0.0 for c, gt_ans in zip(completions, answer)]
    state["gen"] += 1
    lens = kw.get("completion_ids")
    rec = {"step": state["gen"], "reward": sum(r) / len(r), "n": len(r), "t": time.time() - state["t0"]}
    if lens is not None:
        rec["len"] = sum(len(x) for x in lens) / len(lens)
    logf.write(json.dumps(rec) + "\n")
    logf.flush()
    print(f"gen {state['gen']} reward {rec['reward']:.3f}", file=sys.stderr, flush=True)
    return r


tok = AutoTokenizer.from_pretrained(args.model)
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

cfg = GRPOConfig(
    output_dir=args.out,
    seed=args.seed,
    max_steps=args.steps * args.spg,
    per_device_train_batch_size=256 // args.spg,
    gradient_accumulation_steps=1,
    steps_per_generation=args.spg,
    num_generations=8,
    max_completion_length=8,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    learning_rate=args.lr,
    lr_scheduler_type="constant",
    warmup_steps=0,
    adam_beta1=0.9,
    adam_beta2=args.beta2,
    adam_epsilon=1e-8,
    weight_decay=0.0,
    max_grad_norm=args.grad_clip,
    beta=0.0,
    epsilon=0.2,
    epsilon_high=0.28,
    delta=args.delta if args.delta > 0 else None,
    num_iterations=1,
    loss_type=args.loss_type,
    scale_rewards="group",
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    bf16=False,
    dataloader_num_workers=0,
    disable_tqdm=True,
)
trainer = GRPOTrainer(model=model, reward_funcs=reward_fn, args=cfg, train_dataset=ds, processing_class=tok)
trainer.train()
with open(os.path.join(args.out, "log_history.jsonl"), "w") as f:
    for h in trainer.state.log_history:
        f.write(json.dumps(h) + "\n")
trainer.model.save_pretrained(os.path.join(args.out, "final"))
tok.save_pretrained(os.path.join(args.out, "final"))
print("versions", trl.__version__, torch.__version__, file=sys.stderr)
