"""The README's API example on tiny random models (runs anywhere in seconds, no downloads).

    python experiments/example_api.py
"""

import treespec
from treespec.recipes import NGramSettings, Recipe, shape_for
from treespec.models.tiny import perturbed_copy, tiny_model


def main() -> None:
    target = tiny_model(vocab=128, hidden=64)
    draft = perturbed_copy(target, 0.2)  # a stand-in for a small model of the same family
    # budget 12: the n-gram drafter reserves 4 nodes, the Sequoia tree is sized for the other 8
    recipe = Recipe(tree="sequoia", budget=12, acceptance=[0.62, 0.12, 0.05, 0.03], ngram=NGramSettings())
    print(shape_for(recipe))
    prompt = [1, 17, 42, 5, 17, 42, 5, 17]
    out = treespec.run(recipe, target, [draft], prompt, max_new_tokens=48)  # drafters, cap and sampling: one recipe
    plain = treespec.generate(target, prompt, max_new_tokens=48)
    print("new tokens:", out.new_tokens)
    print(f"tau {out.stats.tau:.2f}, accepted per step {out.stats.accepted_hist}, "
          f"identical to plain greedy: {out.new_tokens == plain.new_tokens}")
    for d in out.stats.drafters:
        print(f"  {d.name}: {d.accepted}/{d.proposed} proposals committed")


if __name__ == "__main__":
    main()
