"""Every command behaves alike: typo suggestions, `error: ...` with exit 1, quiet start-up, no needless TensorFlow."""

import importlib
import json
import logging
import os
import re
import subprocess
import sys

import pytest
from PIL import Image

from keras_yolo_mgpu.cli import runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (command line as users type it, a misspelt flag, the flag it should suggest)
COMMANDS = [
    (["train.py"], "--epoch", "--epochs"),
    (["train_bottleneck.py"], "--bottleneck-epoch", "--bottleneck-epochs"),
    (["yolo_video.py"], "--scor", "--score"),
    (["convert.py"], "--generc", "--generic"),
    (["evaluate.py"], "--detection", "--detections"),
    (["kmeans.py"], "--cluster", "--clusters"),
    (["voc_annotation.py"], "--set", "--sets"),
    (["coco_annotation.py"], "--keep-emty", "--keep-empty"),
    (["-m", "keras_yolo_mgpu.demo"], "--epoch", "--epochs"),
    (["-m", "keras_yolo_mgpu.check_dataset"], "--no-image", "--no-images"),
    (["-m", "keras_yolo_mgpu.export"], "--formt", "--format"),
    (["-m", "keras_yolo_mgpu.bench", "train"], "--step", "--steps"),
    (["-m", "keras_yolo_mgpu.bench", "pipeline"], "--batchs", "--batches"),
    (["-m", "keras_yolo_mgpu.bench", "infer"], "--frame", "--frames"),
    (["-m", "keras_yolo_mgpu.align"], "--step", "--steps"),
    (["-m", "keras_yolo_mgpu.align", "diff"], "--threshhold", "--threshold"),
]


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


def _python(*args, timeout=120, env=None, cwd=REPO):
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env or _env(), cwd=cwd
    )


@pytest.mark.parametrize("command,typo,meant", COMMANDS, ids=[" ".join(c[0]) for c in COMMANDS])
def test_every_command_suggests_the_flag_meant(command, typo, meant):
    # The typo comes first and required arguments are missing: the typo must still be what is reported.
    result = _python(*[os.path.join(REPO, c) if c.endswith(".py") else c for c in command], typo, "3")
    assert result.returncode == 2, result.stderr
    assert f"did you mean {meant}?" in result.stderr


CLI_MODULES = ["train", "train_bottleneck", "detect", "convert", "evaluate", "kmeans", "voc", "coco", "demo"]
CLI_MODULES += ["check_dataset", "export"]
CLI_MODULES += ["bench_train", "bench_pipeline", "bench_infer", "bench_e2e", "bench_exports", "align"]


@pytest.mark.parametrize("module", CLI_MODULES)
def test_every_command_uses_the_shared_parser_with_verbose(module):
    parser = importlib.import_module(f"keras_yolo_mgpu.cli.{module}").build_parser()
    assert isinstance(parser, runner.ArgumentParser)
    assert "--verbose" in parser._option_string_actions and "-v" in parser._option_string_actions


def test_unknown_benchmark_gets_a_suggestion():
    result = _python("-m", "keras_yolo_mgpu.bench", "trian")
    assert result.returncode == 2 and "did you mean train?" in result.stderr


# ---- the error epilogue -------------------------------------------------------


def _parser():
    return runner.ArgumentParser(prog="demo-command")


def test_expected_error_is_one_line_and_exit_1(capsys):
    def body(args):
        raise FileNotFoundError("annotation file not found: x.txt")

    assert runner.run_command(_parser, body, []) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: annotation file not found: x.txt")
    assert "Traceback" not in err


def test_verbose_shows_the_traceback(capsys):
    def body(args):
        raise ValueError("bad anchors")

    assert runner.run_command(_parser, body, ["-v"]) == 1
    err = capsys.readouterr().err
    assert "error: bad anchors" in err and "Traceback" in err


def test_verbose_logs_the_projects_debug_lines_and_not_the_libraries():
    """-v buried the project's lines under the libraries' (BENCHMARKS.md, "Log lines under -v")."""
    root = logging.getLogger()
    saved = root.level
    try:
        runner.setup_logging(verbose=True)
        for name in ("keras_yolo_mgpu.data.host", "train", "evaluate"):
            assert logging.getLogger(name).isEnabledFor(logging.DEBUG), name
        for name in ("PIL.PngImagePlugin", "matplotlib.font_manager", "jax._src.cache_key", "filelock"):
            assert not logging.getLogger(name).isEnabledFor(logging.DEBUG), name
            assert logging.getLogger(name).isEnabledFor(logging.INFO), name
    finally:
        root.setLevel(saved)


def test_unexpected_errors_keep_their_traceback():
    def body(args):
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        runner.run_command(_parser, body, [])


def test_usage_error_exits_2(capsys):
    def body(args):
        raise runner.UsageError("--resume needs --log-dir")

    with pytest.raises(SystemExit) as exit_info:
        runner.run_command(_parser, body, [])
    assert exit_info.value.code == 2
    assert "demo-command: error: --resume needs --log-dir" in capsys.readouterr().err


def _write_classes(tmp_path):
    path = tmp_path / "classes.txt"
    path.write_text("cat\ndog\n")
    return str(path)


def _one_image_dataset(tmp_path):
    Image.new("RGB", (32, 24), (90, 120, 30)).save(tmp_path / "a.png")
    annotations = tmp_path / "train.txt"
    annotations.write_text(f"{tmp_path / 'a.png'} 1,2,20,20,0 3,3,9,12,1\n")
    return str(annotations)


def test_real_commands_report_bad_input_as_error_exit_1(tmp_path):
    """Bad input reaching the library (not the parser): `error: ...`, exit 1, no traceback."""
    annotations = _one_image_dataset(tmp_path)
    bad_json = tmp_path / "instances.json"
    bad_json.write_text(json.dumps({"images": [], "categories": [{"id": 1}]}))
    cases = [
        ([os.path.join(REPO, "kmeans.py"), "--annotations", annotations], "9 clusters need at least 9"),
        (
            [os.path.join(REPO, "train.py"), "--annotations", annotations, "--classes", annotations, "--weights"]
            + ["yolov3-tinyy"],
            "yolov3-tinyy: no such file, and no official net of that name (did you mean yolov3-tiny?",
        ),
        (
            [os.path.join(REPO, "evaluate.py"), "--annotations", annotations, "--detections", str(tmp_path / "d.json")],
            "detections file not found",
        ),
        (
            [
                os.path.join(REPO, "coco_annotation.py"),
                "--instances",
                str(bad_json),
                "--image-dir",
                "x",
                "--output",
                str(tmp_path / "o.txt"),
            ],
            "missing key",
        ),
    ]
    for args, message in cases:
        result = _python(*args)
        assert result.returncode == 1, (args, result.stderr)
        assert re.search(r"^error: .*" + re.escape(message), result.stderr, re.M), result.stderr
        assert "Traceback" not in result.stderr


# ---- no TensorFlow where none is needed ---------------------------------------

_NO_TF = """
import sys
from keras_yolo_mgpu.cli import check_dataset, coco, kmeans, voc
status = [
    kmeans.main(["--annotations", sys.argv[1], "--clusters", "2"]),
    check_dataset.main([sys.argv[1], "--classes", sys.argv[2]]),
    voc.main(["--xml-dir", sys.argv[3], "--image-dir", "i", "--classes", sys.argv[2], "--output", sys.argv[4]]),
    coco.main(["--instances", sys.argv[5], "--image-dir", "i", "--output", sys.argv[4], "--classes", sys.argv[2]]),
]
print("STATUS", status, "TENSORFLOW", sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras")))
"""


def test_data_tools_never_import_tensorflow(tmp_path):
    annotations = _one_image_dataset(tmp_path)
    classes = _write_classes(tmp_path)
    xml_dir = tmp_path / "xml"
    xml_dir.mkdir()
    (xml_dir / "a.xml").write_text(
        "<annotation><filename>a.png</filename><object><name>cat</name>"
        "<bndbox><xmin>1</xmin><ymin>2</ymin><xmax>9</xmax><ymax>9</ymax></bndbox></object></annotation>"
    )
    instances = tmp_path / "instances.json"
    instances.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "a.png"}],
                "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 2, 3, 4], "iscrowd": 0}],
                "categories": [{"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}],
            }
        )
    )
    out = str(tmp_path / "out.txt")
    result = _python("-c", _NO_TF, annotations, classes, str(xml_dir), out, str(instances))
    assert result.returncode == 0, result.stderr
    assert "STATUS [0, 0, 0, 0] TENSORFLOW []" in result.stdout, result.stdout + result.stderr


# ---- quiet by default ---------------------------------------------------------


def test_no_command_imports_keras_before_it_parses_its_arguments():
    """Keras starts TensorFlow, whose loader lines only `run_command` hides (it imports TensorFlow after parsing)."""
    code = "import sys\nfrom keras_yolo_mgpu.cli import " + ", ".join(CLI_MODULES) + "\n"
    code += "".join(f"getattr({name}, 'build_parser', lambda: None)()\n" for name in CLI_MODULES)
    code += "print(sorted({m.split('.')[0] for m in sys.modules} & {'keras', 'tensorflow', 'jax'}))"
    result = _python("-c", code, env=dict(_env(), KERAS_BACKEND="tensorflow"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_tensorflow_imported_later_on_jax_is_quiet_even_after_a_lookup():
    """Keras on JAX imports TensorFlow mid-run (serializer, TensorBoard), after `find_spec` asked if it is there."""
    code = (
        "import importlib.util\nfrom keras_yolo_mgpu.cli import quiet\nquiet.quiet_tensorflow_import()\n"
        "assert importlib.util.find_spec('tensorflow') is not None\nimport tensorflow\nprint('imported')"
    )
    env = _env(KERAS_BACKEND="jax")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as in a user's shell
    result = _python("-c", code, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "imported", result.stderr
    assert "absl::InitializeLog" not in result.stderr and not re.search(r"^[IW]\d{4} ", result.stderr, re.M)


def test_loader_noise_is_dropped_with_its_continuation_lines():
    from keras_yolo_mgpu.cli.quiet import _without_load_noise

    text = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1795418741.268058   24490 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\n"
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow.\n"
        "E0000 00:00:1795418741.3   24490 foo.cc:1] a real error\n"
        "something else printed\n"
    )
    assert _without_load_noise(text) == [
        "E0000 00:00:1795418741.3   24490 foo.cc:1] a real error",
        "something else printed",
    ]


def test_train_refuses_a_cfg_it_would_not_read(tmp_path, capsys):
    """--cfg is read only to convert Darknet --weights: without them it would be ignored in silence."""
    from keras_yolo_mgpu.cli import train

    cfg = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_data", "yolov3-tiny.cfg")
    flags = ["--annotations", _one_image_dataset(tmp_path), "--classes", _write_classes(tmp_path), "--cfg", cfg]
    with pytest.raises(SystemExit) as exit_info:
        train.main([*flags, "--log-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    assert f"--cfg {cfg} is read only to convert Darknet --weights" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_train_warns_of_each_flag_the_run_will_not_read(tmp_path, caplog):
    from keras_yolo_mgpu.cli import train

    flags = ["--annotations", _one_image_dataset(tmp_path), "--classes", _write_classes(tmp_path)]
    flags += ["--lr2", "1e-5", "--batch-size2", "2", "--memory-budget", "3", "--image-dir", str(tmp_path)]
    config = train.config_for(train.build_parser().parse_args([*flags, "--log-dir", str(tmp_path / "run")]))
    assert config.freeze_epochs == config.epochs  # the default recipe: one stage
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert [warning.split(" is not used: ")[0] for warning in warnings] == [
        "--lr2", "--batch-size2", "--memory-budget", "--image-dir"
    ]  # fmt: skip
    assert "the batch is 32" in warnings[2]
    caplog.clear()  # where the run reads them, nothing is said
    flags = [*flags[:4], "--lr2", "1e-5", "--freeze-epochs", "2", "--epochs", "4", "--batch-size", "auto"]
    train.config_for(train.build_parser().parse_args([*flags, "--memory-budget", "3", "--log-dir", str(tmp_path)]))
    assert not [record for record in caplog.records if record.levelname == "WARNING"]
