"""The command line (CPU): every subcommand and option explains itself, and the GPU commands say what to do
on a machine without a GPU instead of failing with a traceback."""

import pytest
import torch

from cute_kernels import __main__ as cli
from cute_kernels import registry


@pytest.mark.parametrize("command", list(cli.SUBCOMMANDS))
def test_every_subcommand_and_option_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert cli.SUBCOMMANDS[command] in " ".join(text.split())
    for op in {spec.op for spec in registry.list()}:
        assert op in text  # --op lists the ops



def test_every_option_has_help_text():
    import argparse

    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == set(cli.SUBCOMMANDS)
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"{name} {action.option_strings}: no help text"


def test_an_unknown_op_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        cli.main(["list", "--op", "matmul"])
    assert "choose from" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU messages")
def test_sweep_without_a_gpu_points_to_compile_only():
    with pytest.raises(SystemExit, match="--compile-only"):
        cli.main(["sweep", "--op", "scan"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU messages")
def test_bench_write_without_a_gpu_says_nothing_was_written(tmp_path, capsys):
    target = tmp_path / "report.md"
    # linear_scan: the op whose compile check (what bench runs without a GPU) is the shortest.
    assert cli.main(["bench", "--op", "linear_scan", "--write", str(target)]) == 0
    assert f"{target} was not written" in capsys.readouterr().out
    assert not target.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU messages")
def test_precompile_without_a_gpu_asks_for_an_arch():
    with pytest.raises(SystemExit, match="--arch"):
        cli.main(["precompile", "--op", "scan"])
