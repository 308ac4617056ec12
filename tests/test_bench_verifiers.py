"""experiments/bench_verifiers.py runs end to end on tiny models (--smoke), writes its outputs and resumes."""

import json
import runpy
from pathlib import Path

import pytest

bench = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "bench_verifiers.py"))
ARGS = ["--smoke", "--prompts", "2", "--max-new-tokens", "6", "--datasets", "humaneval",
        "--constructions", "chain", "sequoia@1.0,0.6", "iid-kary"]


def test_smoke_writes_outputs_and_resumes(tmp_path):
    summaries = bench["main"]([*ARGS, "--out", str(tmp_path)])
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    # chain: 3 verifiers, sequoia: 2 x 2 temperatures, iid-kary: 3 -> 10 runs per prompt
    assert len(records) == 2 * 10
    keys = {(r["construction"], r["temperature"], r["prompt"], r["verifier"]) for r in records}
    assert len(keys) == len(records)
    for r in records:
        assert r["new_tokens"] == 6 and r["steps"] >= 1 and r["tau"] == pytest.approx(6 / r["steps"])
        assert r["tokens_per_second"] > 0 and r["dataset"] == "humaneval" and r["prompt"] in (100, 101)
    seeds = {(r["construction"], r["temperature"], r["prompt"]): set() for r in records}
    for r in records:
        seeds[(r["construction"], r["temperature"], r["prompt"])].add(r["seed"])
    assert all(len(s) == 1 for s in seeds.values())  # one seed per prompt, shared by every verifier
    assert {r["verifier"] for r in records if r["construction"] == "chain"} == {"block", "traversal", "rrs"}
    assert {r["verifier"] for r in records if r["construction"] == "iid-kary"} == {"spectr", "traversal", "rrs"}

    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["smoke"] and saved["command"].startswith("python experiments/bench_verifiers.py --smoke")
    assert len(saved["summaries"]) == len(summaries) == 4  # chain, sequoia x 2, iid-kary
    chain = next(s for s in saved["summaries"] if s["construction"] == "chain")
    assert set(chain["verifiers"]["block"]["vs_rrs"]) == {"tau_ratio", "speed_ratio"}
    assert "vs_rrs" not in chain["verifiers"]["rrs"]
    readme = (tmp_path / "README.md").read_text()
    assert "SMOKE" in readme and "| chain | 1 | humaneval | 2 | block |" in readme
    assert (tmp_path / "gain_over_rrs.png").stat().st_size > 0

    # resume: a torn last line is cut, the finished runs are skipped, only the missing one is redone
    lines = (tmp_path / "results.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "results.jsonl").write_text("".join(lines[:-1]) + lines[-1][:10])
    bench["main"]([*ARGS, "--out", str(tmp_path)])
    again = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(again) == len(records)
    assert again[:-1] == records[:-1]
    assert {k: v for k, v in again[-1].items() if "second" not in k and k != "finished_at"} == \
        {k: v for k, v in records[-1].items() if "second" not in k and k != "finished_at"}  # same seed, same run


def test_ratio_pairs_prompts_per_token():
    def rec(v, p, steps, seconds, tokens=12):
        return dict(construction="chain", temperature=1.0, dataset="humaneval", prompt=p, verifier=v,
                    new_tokens=tokens, steps=steps, tau=tokens / steps, tau_uncut=tokens / steps, seconds=seconds)

    records = [rec("rrs", 0, 6, 3.0), rec("block", 0, 4, 2.0), rec("rrs", 1, 4, 2.0), rec("block", 1, 4, 2.0),
               rec("traversal", 0, 3, 1.0)]  # traversal lacks prompt 1: the group keeps prompts all finished
    (s,) = bench["summarize"](records)
    assert s["prompts"] == [0]
    assert s["verifiers"]["traversal"]["vs_rrs"]["tau_ratio"]["estimate"] == pytest.approx(2.0)
    records = records[:4]
    (s,) = bench["summarize"](records)
    gain = s["verifiers"]["block"]["vs_rrs"]
    assert gain["tau_ratio"]["estimate"] == pytest.approx(10 / 8)  # steps: rrs 6 + 4, block 4 + 4
    assert gain["tau_ratio"]["per_prompt_max"] == pytest.approx(1.5) and gain["tau_ratio"]["prompts_better"] == 1
    assert gain["speed_ratio"]["estimate"] == pytest.approx(5 / 4)


def test_bad_construction_is_refused():
    with pytest.raises(SystemExit, match="unknown construction 'tree'"):
        bench["parse_constructions"](["tree"], [1.0])
    with pytest.raises(SystemExit, match="temperatures must be > 0"):
        bench["parse_constructions"](["chain@0"], [1.0])
    assert bench["parse_constructions"](["chain", "sequoia@1,0.6"], [1.0]) == \
        [("chain", 1.0), ("sequoia", 1.0), ("sequoia", 0.6)]
