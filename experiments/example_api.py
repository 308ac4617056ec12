"""The README's API example on tiny random models (runs anywhere in seconds, no downloads).

    python experiments/example_api.py
"""

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import treespec
from tree_builders import sequoia


def tiny(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


def main() -> None:
    target = tiny(0)
    draft = copy.deepcopy(target)  # a stand-in for a small model of the same family
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.2 * p.std().nan_to_num(0.0) * torch.randn_like(p))
    shape = sequoia([0.62, 0.12, 0.05, 0.03], budget=8)
    print(shape)
    prompt = [1, 17, 42, 5, 17, 42, 5, 17]
    out = treespec.generate(target, prompt,
                            drafters=[treespec.ModelDrafter(draft, shape, mode="topk"), treespec.NGramDrafter()],
                            max_new_tokens=48, temperature=0.0, budget=12)
    plain = treespec.generate(target, prompt, max_new_tokens=48)
    print("new tokens:", out.new_tokens)
    print(f"tau {out.stats.tau:.2f}, accepted per step {out.stats.accepted_hist}, "
          f"identical to plain greedy: {out.new_tokens == plain.new_tokens}")
    for d in out.stats.drafters:
        print(f"  {d.name}: {d.accepted}/{d.proposed} proposals committed")


if __name__ == "__main__":
    main()
