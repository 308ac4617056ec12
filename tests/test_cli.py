"""The treespec command: argument errors, help, and (slow) the real pair end to end."""

import pytest

from treespec.cli import build_parser, main


def parse_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv,fragment", [
    (["generate"], "one of the arguments --prompt --prompt-file is required"),
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
