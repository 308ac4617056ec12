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
    report = (tmp_path / "report.md").read_text()
    assert "| seconds per step |" in report and "prefill per prompt charged to both" in report


def test_prediction_table_charges_prefill_to_both_sides():
    """Hand-made records: 2 prompts of 10 tokens in 4 steps each, 1 s of prefill and 0.5 s per step;
    the prediction: tau 2.5, 0.5 s per step, plain decoding 0.4 s per token."""
    choice = argparse.Namespace(tau=2.5, step_seconds=0.5, plain_seconds=0.4)
    mine = [{"method": "treespec", "steps": 4, "tokens": 10, "seconds": 3.0, "prefill_seconds": 1.0,
             "drafting_seconds": 1.2, "verifying_seconds": 0.7, "engine_seconds": 0.1} for _ in range(2)]
    alone = [{"method": "hf-float32", "tokens": 10, "seconds": 5.0} for _ in range(2)]
    table = demo.predicted_and_measured(choice, mine + alone, "hf-float32")
    assert "| tokens per step (tau) | 2.50 | 2.50 |" in table
    assert "| seconds per step | 0.500 | 0.500 |" in table
    # predicted (1 + 10 * 0.4) / (1 + 10 / 2.5 * 0.5) = 5 / 3; measured (20 / 6) / (20 / 10) = 5 / 3
    assert "1.00 s of prefill per prompt charged to both | 1.67x | 1.67x |" in table
    assert demo.predicted_and_measured(choice, mine, "hf-float32") == ""  # nothing to compare with
