"""`python -m keras_yolo_mgpu.bench train --reference keras-yolo3`: ours and keras-yolo3's step in one run."""

import json

import pytest

from keras_yolo_mgpu.cli import bench_train


@pytest.mark.slow
def test_reference_comparison_and_breakdown_print_ratio_json(capsys):
    pytest.importorskip("tf_keras")
    argv = ["--tiny", "--input-size", "64", "--num-classes", "2", "--batch-size", "2", "--steps", "1"]
    argv += ["--warmup-steps", "1", "--rounds", "2", "--reference", "keras-yolo3", "--variants", "keras-bn"]
    argv += ["--breakdown"]
    assert bench_train.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(result["images_per_sec_rounds"]) == len(result["keras-yolo3_images_per_sec_rounds"]) == 2
    expected = result["images_per_sec"] / result["keras-yolo3_images_per_sec"]
    assert result["ratio_vs_keras-yolo3"] == pytest.approx(expected, rel=1e-2)
    assert "ratio_vs_keras-bn" in result
    for side in ("ours", "keras-yolo3", "keras-bn"):
        split = result["breakdown"][side]["split_ms"]
        assert set(split) == {"forward", "loss", "backward", "optimizer", "keras_fit_overhead", "fit_step"}
        assert split["fit_step"] > 0


def test_unknown_variant_is_refused(capsys):
    try:
        status = bench_train.main(["--variants", "turbo"])
    except SystemExit as exit_:
        status = exit_.code
    assert status == 2
    assert "unknown variant" in capsys.readouterr().err


@pytest.mark.slow
def test_adam_with_ema_against_keras_adam_on_two_replicas(capsys):
    argv = ["--tiny", "--input-size", "64", "--num-classes", "2", "--batch-size", "4", "--steps", "1"]
    argv += ["--warmup-steps", "1", "--gpus", "2", "--simulate-devices", "--optimizer", "adam", "--ema", "0.9"]
    assert bench_train.main([*argv, "--variants", "keras-adam"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["replicas"] == 2 and result["optimizer"] == "adam" and result["ema"] == 0.9
    assert result["images_per_sec"] > 0 and result["keras-adam_images_per_sec"] > 0


def test_keras_adam_variant_needs_adam(capsys):
    assert bench_train.main(["--tiny", "--variants", "keras-adam"]) == 1
    assert "--optimizer adam" in capsys.readouterr().err


@pytest.mark.slow
def test_backends_are_timed_in_interleaved_rounds_with_their_ratio(capsys):
    """`--backends tensorflow,jax`: one process per backend, the same step, rounds alternating, the ratio."""
    argv = ["--backends", "tensorflow,jax", "--tiny", "--input-size", "32", "--num-classes", "2"]
    argv += ["--batch-size", "2", "--steps", "2", "--warmup-steps", "1", "--rounds", "2"]
    assert bench_train.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert [result[b]["backend"] for b in ("tensorflow", "jax")] == ["tensorflow", "jax"]
    assert result["jax"]["jit"] is True and result["jax"]["inputs"] == "device"
    rates = {b: result[b]["images_per_sec_rounds"] for b in ("tensorflow", "jax")}
    assert len(rates["tensorflow"]) == len(rates["jax"]) == 2
    expected = result["jax"]["images_per_sec"] / result["tensorflow"]["images_per_sec"]
    assert result["ratio_jax_vs_tensorflow"] == pytest.approx(expected, rel=1e-2)
    assert sum(line.startswith("round ") for line in lines) == 2


def test_backends_refuse_what_only_tensorflow_times(capsys):
    assert bench_train.main(["--backends", "tensorflow,jax", "--reference", "keras-yolo3"]) == 1
    assert "--backends times our step only" in capsys.readouterr().err
