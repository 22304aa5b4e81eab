"""The ``swattn`` command: subcommand registry, ``tiles`` output (JSON exactly), ``prove``
exit status, ``python -m swattn``, and no heavy imports at module top level."""

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

from swattn import cli, tiles

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
SEED = ["--prefix", "128", "--extend", "8192", "--window-left", "127", "--block-m", "128",
        "--block-n", "64"]


def _run(argv, capsys):
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_tiles_json_is_exactly_the_counts(capsys):
    status, out, _ = _run(["tiles", *SEED, "--json"], capsys)
    assert status == 0
    assert out == json.dumps(tiles.count_tiles(128, 8192, 127, block_m=128, block_n=64)) + "\n"
    counts = json.loads(out)
    assert counts["stage1"]["all"] + counts["stage2"]["tight"] == 382
    assert counts["stage1"]["tight"] + counts["stage2"]["tight"] == 256


def test_tiles_table_shows_predicted_changes(capsys):
    status, out, _ = _run(["tiles", *SEED], capsys)
    assert status == 0
    assert "two-stage kernel (stage 2 already bounded): 382 -> 256 tiles, -33.0%" in out
    assert "unified kernel: 4,288 -> 256 tiles, -94.0%" in out


def test_tiles_multipliers_and_workload(capsys):
    _, out, _ = _run(["tiles", "--workload", "0:4096,128:4096", "--window-left", "127",
                      "--batch", "2", "--heads", "16", "--json"], capsys)
    expected = tiles.count_workload([(0, 4096), (128, 4096)], 127, batch=2, heads=16)
    assert json.loads(out) == expected


def test_tiles_non_causal_window_right(capsys):
    _, out, _ = _run(["tiles", "--prefix", "17", "--extend", "300", "--window-left", "31",
                      "--window-right", "5", "--non-causal", "--block-m", "32",
                      "--block-n", "16", "--json"], capsys)
    assert json.loads(out) == tiles.count_tiles(17, 300, 31, 5, False, 32, 16)


def test_tiles_decode(capsys):
    _, out, _ = _run(["tiles", "--decode", "8192,100", "--window-left", "127", "--json"], capsys)
    assert json.loads(out) == {"keys": {"all": 8292, "tight": 228, "aligned": 228},
                               "tiles": {"all": 130, "tight": 4, "aligned": 4}}


def test_tiles_attention_chunk(capsys):
    """``--attention-chunk``: the chunked counts as JSON, and in the table what the chunk's
    bounds save over masking it (Llama 4 Scout's 32k prefill in 8k steps, 40 heads)."""
    workload = "0:8192,8192:8192,16384:8192,24576:8192"
    shapes = tiles.parse_workload(workload)
    _, out, _ = _run(["tiles", "--workload", workload, "--attention-chunk", "8192", "--heads",
                      "40", "--json"], capsys)
    assert json.loads(out) == tiles.count_workload(shapes, heads=40, chunk=8192)
    _, out, _ = _run(["tiles", "--workload", workload, "--attention-chunk", "8192", "--heads",
                      "40"], capsys)
    assert "attention_chunk 8192" in out.splitlines()[0]
    assert out.rstrip("\n") == tiles.format_table(
        tiles.count_workload(shapes, heads=40, chunk=8192), out.splitlines()[0],
        tiles.count_workload(shapes, heads=40))
    _, out, _ = _run(["tiles", "--decode", "32768,131072", "--attention-chunk", "8192",
                      "--heads", "40", "--json"], capsys)
    assert json.loads(out) == tiles.count_decode([32768, 131072], heads=40, chunk=8192)


@pytest.mark.parametrize("argv,message", [
    (["tiles", "--prefix", "1", "--extend", "2", "--window-right", "3"], "--non-causal"),
    (["tiles", "--prefix", "1"], "--extend"),
    (["tiles", "--prefix", "1", "--extend", "2", "--workload", "1:2"], "--workload"),
    (["tiles", "--workload", "1-2"], "PREFIX:EXTEND"),
    (["tiles", "--decode", "100", "--non-causal"], "--decode is causal"),
    (["tiles", "--decode", "0", "--window-left", "3"], "seq_lens"),
], ids=["right-without-non-causal", "prefix-alone", "two-shapes", "bad-workload",
        "non-causal-decode", "empty-decode"])
def test_tiles_rejects_bad_arguments(argv, message, capsys):
    status, out, err = _run(argv, capsys)
    assert status == 2 and out == ""
    assert message in err


def test_negative_window_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["tiles", "--prefix", "1", "--extend", "2", "--window-left", "-1"])
    assert exit_info.value.code == 2


def test_prove_quick_json(capsys):
    status, out, _ = _run(["prove", "--quick", "--json"], capsys)
    result = json.loads(out)
    assert status == 0 and result["ok"] is True and result["violations"] == 0
    assert set(result["loops"]) == {"stage1", "stage2", "unified", "ranges", "decode",
                                    "decode-splits", "stage1-chunk", "stage2-chunk",
                                    "unified-chunk", "decode-chunk", "decode-splits-chunk",
                                    "second", "second-splits"}


@pytest.mark.parametrize("argv,expected", [([], []), (["--no-check"], ["--no_check"]),
                                           (["--no-check", "--no-baselines"],
                                            ["--no_baselines", "--no_check"])],
                         ids=["no-arguments", "no-check", "two-flags"])
def test_no_subcommand_runs_demo(argv, expected, monkeypatch):
    seen = []
    original = cli.COMMANDS["demo"]

    def fake_run(args):
        seen.append(sorted(f"--{k}" for k, v in vars(args).items() if v is True))
        return 7

    monkeypatch.setitem(cli.COMMANDS, "demo", cli.Command("demo", original.help,
                                                          original.add_arguments, fake_run))
    assert cli.main(argv) == 7
    assert seen == [sorted(expected)]


def test_registry_takes_a_new_command(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", dict(cli.COMMANDS))
    cli.register(cli.Command("echo", "print a word", lambda p: p.add_argument("word"),
                             lambda args: print(args.word) or 0))
    assert _run(["echo", "hi"], capsys)[:2] == (0, "hi\n")
    with pytest.raises(ValueError, match="already registered"):
        cli.register(cli.Command("echo", "again", lambda p: None, lambda args: 0))


FAKE_COMMAND_MODULE = """
def add_arguments(parser):
    parser.add_argument("--times", type=int, default=1)

def run(args):
    print("run " * args.times)
    return 3

def main(argv, prog):
    print("main", prog, argv)
    return 4
"""


def test_registry_takes_module_and_forward_commands(monkeypatch, tmp_path, capsys):
    """The two ways verify and bench plug in: a module with add_arguments/run, and a
    module whose main(argv) parses its own arguments (``--help`` included)."""
    (tmp_path / "fake_swattn_command.py").write_text(FAKE_COMMAND_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "COMMANDS", dict(cli.COMMANDS))
    cli.register(cli.from_module("fake", "a module command", "fake_swattn_command"))
    cli.register(cli.Command("fwd", "a forwarded command", forward="fake_swattn_command:main"))
    assert _run(["fake", "--times", "2"], capsys)[:2] == (3, "run run \n")
    assert _run(["fwd", "--help", "x"], capsys)[:2] == (4, "main swattn fwd ['--help', 'x']\n")
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = capsys.readouterr().out
    assert "fake" in help_text and "fwd" in help_text and "prove" in help_text
    with pytest.raises(ValueError, match="exactly one"):
        cli.register(cli.Command("neither", "no run"))


def test_python_dash_m_swattn_tiles_json():
    env = dict(os.environ, PYTHONPATH=str(SRC))
    completed = subprocess.run([sys.executable, "-m", "swattn", "tiles", *SEED, "--json"],
                               capture_output=True, text=True, env=env, timeout=120,
                               check=False)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == tiles.count_tiles(128, 8192, 127)


MODULES = ["tiles.py", "cli.py", "__main__.py", "verify/__init__.py", "verify/prove.py",
           "verify/blocks.py", "verify/prove_memory.py", "memory/__init__.py",
           "memory/groups.py", "memory/pool.py", "memory/prefix.py", "memory/manager.py",
           "memory/models.py", "memory/policies.py", "memory/sim.py"]


@pytest.mark.parametrize("module", MODULES)
def test_no_torch_or_triton_at_module_top_level(module):
    """The CLI must start fast: torch and triton may only be imported inside functions."""
    tree = ast.parse((SRC / "swattn" / module).read_text())
    for node in tree.body:
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        assert not any(n.split(".")[0] in ("torch", "triton") for n in names), (module, names)


def test_version_is_the_installed_metadata():
    import importlib.metadata

    import swattn
    try:
        installed = importlib.metadata.version("swattn")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("swattn runs from its source tree here, not installed")
    assert swattn.__version__ == installed


def test_version_flag_prints_the_package_version():
    import swattn
    result = subprocess.run([sys.executable, "-m", "swattn", "--version"], capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == f"swattn {swattn.__version__}"


def _help(argv0, argv, monkeypatch, capsys):
    """The --help text of ``argv`` run as the command line of program ``argv0``."""
    monkeypatch.setattr(sys, "argv", [argv0, *argv])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_help_names_the_program_typed(name, monkeypatch, capsys):
    """``swattn bench --help`` said ``usage: python -m swattn.bench`` (the forwarded
    command was not told its program): every subcommand's help names what was typed."""
    out = _help("/usr/local/bin/swattn", [name, "--help"], monkeypatch, capsys)
    assert out.startswith(f"usage: swattn {name} ")
    out = _help(str(SRC / "swattn" / "__main__.py"), [name, "--help"], monkeypatch, capsys)
    assert out.startswith(f"usage: {os.path.basename(sys.executable)} -m swattn {name} ")


def test_python_dash_m_swattn_bench_help():
    env = dict(os.environ, PYTHONPATH=str(SRC))
    completed = subprocess.run([sys.executable, "-m", "swattn", "bench", "--help"],
                               capture_output=True, text=True, env=env, timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(
        f"usage: {os.path.basename(sys.executable)} -m swattn bench ")


def test_replot_without_matplotlib_fails(tmp_path, monkeypatch, capsys):
    """``swattn bench --replot`` without matplotlib printed a note and exited 0, having
    drawn nothing: it exits 2, naming the extra to install."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    results = tmp_path / "extend.json"
    results.write_text(json.dumps({"rows": [], "meta": {}}))
    status, out, err = _run(["bench", "--replot", str(results)], capsys)
    assert status == 2 and out == ""
    assert err.startswith("swattn bench: error: --replot")
    assert "pip install 'swattn[bench]'" in err
