"""`bench train`, and `tools/train_step_compare.py`: our step beside keras-yolo3's and on both Keras backends."""

import importlib
import json
from pathlib import Path

import pytest

from keras_yolo_mgpu.cli import bench_train

TOOLS = Path(__file__).resolve().parents[1] / "tools"
TINY = ["--tiny", "--input-size", "64", "--num-classes", "2", "--steps", "1", "--warmup-steps", "1"]


@pytest.fixture
def compare(monkeypatch):
    """The tool's module, imported as `python tools/train_step_compare.py` imports its neighbours."""
    monkeypatch.syspath_prepend(str(TOOLS))  # spawned children inherit the path, so they can import it too
    return importlib.import_module("train_step_compare")


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_bench_train_times_adam_with_ema_on_two_replicas(capsys):
    argv = [*TINY, "--batch-size", "4", "--gpus", "2", "--simulate-devices", "--optimizer", "adam", "--ema", "0.9"]
    assert bench_train.main([*argv, "--rounds", "2"]) == 0
    result = _last_json(capsys)
    assert result["replicas"] == 2 and result["optimizer"] == "adam" and result["ema"] == 0.9
    assert result["inputs"] == "device" and len(result["images_per_sec_rounds"]) == 2
    assert result["images_per_sec"] > 0 and not any(key.startswith("ratio") for key in result)


def test_bench_train_leaves_the_comparisons_to_the_tool(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_train.main(["--reference", "keras-yolo3"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --reference" in capsys.readouterr().err


@pytest.mark.slow
def test_reference_comparison_and_breakdown_print_ratio_json(compare, capsys):
    pytest.importorskip("tf_keras")
    argv = [*TINY, "--batch-size", "2", "--rounds", "2", "--reference", "keras-yolo3", "--variants", "keras-bn"]
    assert compare.main([*argv, "--breakdown"]) == 0
    result = _last_json(capsys)
    assert result["inputs"] == "dense"
    assert len(result["images_per_sec_rounds"]) == len(result["keras-yolo3_images_per_sec_rounds"]) == 2
    expected = result["images_per_sec"] / result["keras-yolo3_images_per_sec"]
    assert result["ratio_vs_keras-yolo3"] == pytest.approx(expected, rel=1e-2)
    assert "ratio_vs_keras-bn" in result
    for side in ("ours", "keras-yolo3", "keras-bn"):
        split = result["breakdown"][side]["split_ms"]
        assert set(split) == {"forward", "loss", "backward", "optimizer", "keras_fit_overhead", "fit_step"}
        assert split["fit_step"] > 0


@pytest.mark.slow
def test_keras_adam_variant_beside_ours(compare, capsys):
    argv = [*TINY, "--batch-size", "2", "--optimizer", "adam", "--ema", "0.9", "--inputs", "device"]
    assert compare.main([*argv, "--variants", "keras-adam"]) == 0
    result = _last_json(capsys)
    assert result["inputs"] == "device" and result["rounds"] == 1
    assert result["images_per_sec"] > 0 and result["keras-adam_images_per_sec"] > 0
    assert result["ratio_vs_keras-adam"] > 0


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (["--variants", "turbo"], 2, "unknown variant(s) ['turbo']"),
        (["--backends", "tensorflow,tensorflow"], 2, "expected two of tensorflow, jax"),
        (["--tiny", "--variants", "keras-adam"], 1, "--optimizer adam"),
        (["--backends", "tensorflow,jax", "--reference", "keras-yolo3"], 1, "--backends times our step only"),
        (["--tiny"], 1, "nothing to compare"),
        (["--tiny", "--breakdown", "--inputs", "device"], 1, "drop --inputs device"),
    ],
)
def test_the_tool_refuses_what_it_cannot_time(compare, capsys, argv, status, message):
    try:
        found = compare.main(argv)
    except SystemExit as exit_:
        found = exit_.code
    assert found == status
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_backends_are_timed_in_interleaved_rounds_with_their_ratio(compare, capsys):
    """`--backends tensorflow,jax`: one process per backend, the same step, rounds alternating, the ratio."""
    argv = ["--backends", "tensorflow,jax", "--tiny", "--input-size", "32", "--num-classes", "2"]
    argv += ["--batch-size", "2", "--steps", "2", "--warmup-steps", "1", "--rounds", "2"]
    assert compare.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert [result[b]["backend"] for b in ("tensorflow", "jax")] == ["tensorflow", "jax"]
    assert result["jax"]["jit"] is True and result["jax"]["inputs"] == "device"
    rates = {b: result[b]["images_per_sec_rounds"] for b in ("tensorflow", "jax")}
    assert len(rates["tensorflow"]) == len(rates["jax"]) == 2
    expected = result["jax"]["images_per_sec"] / result["tensorflow"]["images_per_sec"]
    assert result["ratio_jax_vs_tensorflow"] == pytest.approx(expected, rel=1e-2)
    assert sum(line.startswith("round ") for line in lines) == 2


def test_bench_train_parser_offers_the_benchmarks_choices():
    """The parser spells the choices out (importing `bench.train` starts Keras): they must stay the same."""
    from keras_yolo_mgpu.bench import train as bench

    assert (bench_train.OPTIMIZERS, bench_train.INPUTS) == (bench.OPTIMIZERS, bench.INPUTS)
