"""The demo's whole path on tiny models (the real pair is what `make demo` runs)."""

import argparse

from treespec.bench import demo
from treespec.models.tiny import ByteTokenizer, perturbed_copy, tiny_model


def test_demo_runs_and_reports(tmp_path, monkeypatch, capsys):
    target = tiny_model("llama", vocab=128, hidden=64, scale=6)
    draft = perturbed_copy(target, 0.2)
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))  # the profile cache
    args = argparse.Namespace(out=tmp_path, prompts=2, max_new_tokens=16, device="cpu", target="unused")
    assert demo.run_demo(args, target, ByteTokenizer(128, max_tokens=48), draft) == 0
    out = capsys.readouterr().out
    assert "identical to hf-float32 (same precision) on 2/2 prompts" in out
    assert (tmp_path / "cache" / "profiles.json").exists()
    assert (tmp_path / "tree.png").stat().st_size > 0
    assert "speedup" in (tmp_path / "report.md").read_text()
