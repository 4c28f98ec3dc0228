"""`bench e2e`: training from JPEG files against the step alone, on a tiny model and a few generated images."""

import json

import pytest

from keras_yolo_mgpu.cli.bench import main
from keras_yolo_mgpu.data.synthetic import make_synthetic_dataset


def test_e2e_times_the_pipeline_and_the_step_and_prints_their_ratio(tmp_path, capsys):
    data = make_synthetic_dataset(tmp_path / "data", num_train=6, num_val=0, image_size=64, seed=0)
    argv = ["e2e", "--annotations", data.train, "--classes", data.classes, "--tiny", "--input-size", "64"]
    assert main([*argv, "--batch-size", "2", "--steps", "3", "--warmup", "1", "--rounds", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["benchmark"] == "e2e" and result["device"] == "CPU" and result["model"] == "yolov3-tiny"
    # The CPU defaults: float32, no XLA.
    assert (result["mixed_precision"], result["jit"]) == (False, False)
    pipeline, in_memory = result["pipeline_images_per_sec"], result["in_memory_images_per_sec"]
    assert pipeline > 0 and in_memory > 0
    assert result["ratio"] == pytest.approx(pipeline / in_memory, rel=0.01)
