"""The treespec command: argument errors, help, and (slow) the real pair end to end."""

import pytest

from treespec.cli import build_parser, main


def parse_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv,fragment", [
    (["generate"], "one of the arguments --prompt --prompt-file --prompts-jsonl is required"),
    (["generate", "--prompt", "x", "--prompt-file", "f"], "not allowed with argument"),
    (["generate", "--prompt", "x", "--budget", "0"], "budget must be >= 1"),
    (["generate", "--prompt", "x", "--temperature", "-1"], "temperature must be >= 0"),
    (["generate", "--prompt", "x", "--top-p", "1.5"], "top-p must be in (0, 1]"),
    (["generate", "--prompt", "x", "--top-p", "0"], "top-p must be in (0, 1]"),
    (["generate", "--prompt", "x", "--tree", "bush"], "invalid choice: 'bush'"),
    (["generate", "--prompt", "x", "--max-new-tokens", "0"], "must be an integer >= 1"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_argument_errors(argv, fragment, capsys):
    assert fragment in parse_error(argv, capsys)


@pytest.mark.parametrize("command", ["generate", "demo", "accept", "profile", "sweep"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: treespec " + command in capsys.readouterr().out


@pytest.mark.slow
def test_real_pair_greedy_equals_target_alone(capsys):
    """`treespec generate --compare` on HumanEval/100 with the default pair: identical greedy output."""
    from treespec.datasets import humaneval_prompts

    prompt = humaneval_prompts(100, 101)[0]
    code = main(["generate", "--prompt", prompt, "--tree", "chain", "--budget", "5", "--max-new-tokens", "24",
                 "--compare"])
    out = capsys.readouterr().out
    assert "greedy outputs identical: yes" in out
    assert code == 0


def run_main(argv, capsys, monkeypatch, debug: bool = False):
    monkeypatch.delenv("TREESPEC_DEBUG", raising=False)
    code = main((["--debug"] if debug else []) + argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("content,fragment", [
    (None, "No such file"),
    ("{", "is not valid JSON"),
    ('{"vectors": [0.5]}', 'has no "vector" entry'),
])
def test_bad_acceptance_file_is_a_user_error(tmp_path, capsys, monkeypatch, content, fragment):
    path = tmp_path / "acc.json"
    if content is not None:
        path.write_text(content)
    code, err = run_main(["generate", "--prompt", "x", "--acceptance", str(path)], capsys, monkeypatch)
    assert code == 2 and err.startswith("treespec: error: ") and fragment in err
    assert "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    argv = ["generate", "--prompt", "x", "--acceptance", str(tmp_path / "missing.json")]
    with pytest.raises(FileNotFoundError):
        run_main(argv, capsys, monkeypatch, debug=True)
    monkeypatch.setenv("TREESPEC_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(argv)


def test_bad_calibration_range_is_a_user_error(capsys, monkeypatch):
    code, err = run_main(["accept", "--calib", "20-0"], capsys, monkeypatch)
    assert code == 2 and "--calib must look like START:STOP" in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_user_error(capsys, monkeypatch):
    code, err = run_main(["generate", "--prompt", "x", "--tree", "chain", "--device", "cuda"], capsys, monkeypatch)
    assert code == 2 and "no CUDA device" in err


def test_sweep_config_errors_are_user_errors(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text("[grid]\nbudget = [4]\n")
    code, err = run_main(["sweep", "--config", str(bad), "--dry-run"], capsys, monkeypatch)
    assert code == 2 and "unknown config key 'grid.budget'" in err
