"""The sampler benchmark counts the work a turn needs the way the samplers do it (its floor and FLOP rates rest on it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import sampler  # noqa: E402


def _trajectory(*turns: tuple[int, int]) -> SimpleNamespace:
    """Turns of (prompt tokens added, sampled tokens)."""
    return SimpleNamespace(turns=[SimpleNamespace(prompt_token_ids=[0] * p, action_token_ids=[1] * a) for p, a in turns])


def test_a_turn_computes_its_new_prompt_and_the_previous_reply_s_last_token() -> None:
    # Turn 1: 10 prompt tokens, 3 sampled; the last sampled one is never fed, so 12 columns are cached.
    # Turn 2: that token, 5 new prompt tokens and 1 of its 2 sampled tokens are computed: 7 tokens ending at 19.
    assert sampler.computed_turns([_trajectory((10, 3), (5, 2))]) == [(12, 12), (7, 19)]


def test_attention_flops_count_every_column_each_new_token_sees() -> None:
    model = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=2, hidden_size=8, tie_word_embeddings=False),
                            named_parameters=lambda: [("w", SimpleNamespace(dim=lambda: 2, numel=lambda: 100))])
    linear, attention = sampler.flops(model, [_trajectory((10, 3), (5, 2))])
    assert linear == 2 * 100 * (12 + 7)
    # positions 0..11 see 1..12 columns, positions 12..18 see 13..19
    assert attention == pytest.approx(4 * 2 * 8 * (sum(range(1, 13)) + sum(range(13, 20))))


def test_the_goal_s_baseline_is_the_sampler_of_the_commit_before_continuous_batching(tmp_path: Path) -> None:
    """The commit's code, not today's, samples the workload: its checkout is first on the subprocess's path."""
    if sampler.checkout(sampler.BEFORE_CONTINUOUS, tmp_path / "commit"):
        pytest.skip(f"commit {sampler.BEFORE_CONTINUOUS} is not in this clone (shallow?)")
    from agentgym.cli.quickstart import demonstration_texts
    from agentgym.models import build_tiny_model

    model = build_tiny_model(tmp_path / "model", texts=demonstration_texts("sokoban", 20))
    args = SimpleNamespace(tasks=1, group=2, in_flight=2, threads=1, device="cpu", commit=sampler.BEFORE_CONTINUOUS)
    seconds, ids = sampler.run_at_commit(tmp_path / "commit", model, args, tmp_path / "out.json")
    record = json.loads((tmp_path / "out.json").read_text())
    assert Path(record["agentgym"]).resolve() == (tmp_path / "commit" / "agentgym").resolve()
    assert seconds > 0 and len(ids) == 2 and all(turns and all(turns) for turns in ids)


def test_a_commit_the_clone_lacks_is_named_with_the_fix(tmp_path: Path) -> None:
    problem = sampler.checkout("0" * 40, tmp_path / "commit")
    assert problem is not None and "0" * 40 in problem and "--commit none" in problem


def test_a_commit_that_reads_as_an_option_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        sampler.main(["--commit=--output=/tmp/x"])  # the = form gets past argparse
    assert "--commit takes a commit" in capsys.readouterr().err


@pytest.mark.parametrize("device, says", [("gpu", "--device takes cpu, cuda or cuda:N"),
                                          ("cuda:x", "--device takes cpu, cuda or cuda:N")])
def test_a_device_that_is_not_one_is_refused_with_the_choices(device: str, says: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        sampler.main(["--device", device])
    assert says in capsys.readouterr().err


def test_cuda_without_a_gpu_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: --device cuda is valid here")
    with pytest.raises(SystemExit):
        sampler.main(["--device", "cuda"])
    err = capsys.readouterr().err
    assert "torch sees no CUDA GPU here" in err and "or use --device cpu" in err


def test_only_the_default_workload_writes_the_committed_result_files() -> None:
    """A probe at another size, or --quick, gets a file named after its workload: it never replaces sampler.json or
    sampler_gpu.json, which the goal table reads."""
    def name(*argv: str) -> str:
        args = SimpleNamespace(device="cpu", quick=False, **sampler.DEFAULT_WORKLOAD)
        for key, value in zip(argv[::2], argv[1::2]):
            setattr(args, key, value if key == "device" else int(value) if key != "quick" else True)
        return sampler.result_name(args)

    assert name() == "sampler" and name("device", "cuda:1") == "sampler_gpu"
    assert name("quick", "1") == "sampler_quick" and name("device", "cuda", "quick", "1") == "sampler_gpu_quick"
    assert name("device", "cuda", "tasks", "128", "in_flight", "1024") == "sampler_gpu_128x8_1024_in_flight"
