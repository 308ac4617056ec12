"""The demo's whole path on tiny models (the real pair is what `make demo` runs)."""

import argparse


from tiny import perturbed_copy, tiny_model
from treespec import demo


class ByteTok:
    """Bytes of the text folded into a tiny vocabulary."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __call__(self, text: str) -> dict:
        return {"input_ids": [b % self.vocab for b in text.encode()][-48:]}


def test_demo_runs_and_reports(tmp_path, monkeypatch, capsys):
    target = tiny_model("llama", vocab=128, hidden=64, scale=6)
    draft = perturbed_copy(target, 0.2)
    monkeypatch.setattr(demo, "load_pair", lambda args: (target, ByteTok(128), [draft]))
    args = argparse.Namespace(out=tmp_path, prompts=2, max_new_tokens=16, device="cpu")
    assert demo.run_demo(args) == 0
    out = capsys.readouterr().out
    assert "| all | yes |" in out
    assert (tmp_path / "tree.png").stat().st_size > 0
    assert "speedup" in (tmp_path / "report.md").read_text()
