"""`python yolo_video.py`: detect objects in images or a video (keras-yolo3's command lines).

python yolo_video.py --model W --image                  # asks `Input image filename:` until end of input
python yolo_video.py --model W --image photos/ --output annotated/
python yolo_video.py --model W clip.mp4 out.mp4         # keras-yolo3's [video_path] [output_path]
python yolo_video.py --model W --input clip.mp4 --output out.mp4
python yolo_video.py --model W --input rtsp://camera/stream --output out.mp4
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli import quiet
from keras_yolo_mgpu.cli.runner import UsageError
from keras_yolo_mgpu.cli.script_settings import DETECT_SETTINGS, ScriptSettings, run_with_settings
from keras_yolo_mgpu.inference import media
from keras_yolo_mgpu.inference.video import check_video_input
from keras_yolo_mgpu.resources import DEFAULT_MODEL_PATH, missing_model_message
from keras_yolo_mgpu.weights.download import resolve_weights
from keras_yolo_mgpu.weights.start_weights import darknet_as_keras
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger("yolo_video")

_PROMPT = "Input image filename:"  # keras-yolo3's, verbatim


class _Parser(cli.ArgumentParser):
    """Positionals may sit on either side of flags (`yolo_video.py --model W clip.mp4 --score 0.5 out.mp4`)."""

    def parse_args(self, args=None, namespace=None):
        return self.parse_intermixed_args(args, namespace)


def build_parser() -> cli.ArgumentParser:
    parser = _Parser(
        prog="yolo_video.py",
        description="Detect objects in images or a video with trained YOLOv3 weights, or with an exported model "
        "(SavedModel folder, .tflite, .onnx, beside its .metadata.json) (keras-yolo3's flags). "
        "Video: yolo_video.py VIDEO [OUTPUT] or --input VIDEO [--output OUTPUT]. "
        "Images: --image PATH ... or, with no PATH, keras-yolo3's prompt for file names.",
    )
    cli.add_model_args(
        parser,
        weights_help="weights to load: .weights.h5, .keras or a Keras 2 .h5 (same as --model)",
        model_flag="--architecture",
    )
    parser.add_argument(
        "--model",
        dest="weights",
        metavar="FILE",
        help="keras-yolo3's name for --weights (default: model_data/yolo.h5)",
    )
    cli.add_detection_args(parser)
    cli.add_inference_run_args(parser, what="frames or images")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--image",
        nargs="*",
        metavar="PATH",
        help="image files and/or folders to annotate; with no PATH, ask for one file name at a time "
        f"(keras-yolo3's '{_PROMPT}' loop, until end of input)",
    )
    # nargs="?" as keras-yolo3's parser: a bare --input or --output parses, and is told apart below.
    source.add_argument(
        "--input",
        nargs="?",
        const="",
        metavar="VIDEO",
        help="video file, stream URL (rtsp://, rtmp://, http(s)://) or camera index (0, 1, ...)",
    )
    parser.add_argument(
        "--output",
        nargs="?",
        const="",
        metavar="PATH",
        help="with a video: the annotated video (.mp4 with mp4v, .avi with MJPG); "
        "with --image: the folder for annotated images (default: detections), or for one image its annotated file "
        "(a name ending .jpg, .png, ...)",
    )
    parser.add_argument("video_path", nargs="?", help="keras-yolo3's positional form of --input")
    parser.add_argument("output_path", nargs="?", help="keras-yolo3's positional form of --output")
    cli.add_overwrite_arg(parser)
    parser.add_argument(
        "--show", action="store_true", help="show the frames or images in a window (off: the tool runs headless)"
    )
    parser.add_argument(
        "--save-json", metavar="FILE", help="write the detections of every frame or image as JSON lines"
    )
    parser.add_argument("--max-frames", type=cli.positive_int, default=None, help="stop after this many video frames")
    return parser


def _video_and_output(args) -> tuple[str | None, str | None]:
    """(video, output) from the flags or keras-yolo3's positionals; video is None in image mode.

    Raises:
        UsageError: a role given twice, or nothing to detect.
    """
    if args.image is not None:
        if args.video_path is not None:
            given = " ".join(p for p in (args.video_path, args.output_path) if p)
            raise UsageError(
                f"--image with a video path ({given}): detect images or a video, not both "
                "(image paths go after --image)"
            )
        return None, args.output or None
    if args.input == "":
        raise UsageError("--input needs a video: a file, a stream URL or a camera index")
    if args.input is not None and args.video_path is not None:
        raise UsageError(
            f"the video is given twice: --input {args.input} and {args.video_path} "
            "(an output path goes after --output, or second in yolo_video.py VIDEO OUTPUT)"
        )
    if args.output is not None and args.output_path is not None:
        raise UsageError(f"the output is given twice: --output {args.output} and {args.output_path}")
    video = args.input if args.input is not None else args.video_path
    if video is None:
        raise UsageError(
            "nothing to detect: give a video (yolo_video.py VIDEO [OUTPUT], or --input VIDEO [--output OUTPUT]) "
            "or images (--image PATH ..., or --image alone to type file names)"
        )
    output = args.output_path if args.output_path is not None else args.output
    return video, output or None


def _typed_names() -> Iterator[str]:
    """Lines typed at keras-yolo3's prompt, until end of input (Ctrl-D; keras-yolo3 died there with EOFError).

    Names from a pipe or a file (`yolo_video.py --image < names.txt`) are
    echoed after the prompt, as a terminal shows what is typed: the prompt's
    line ends before the image's log line, and the log says which name it read.
    """
    echo = not sys.stdin.isatty()
    while True:
        try:
            name = input(_PROMPT)
        except EOFError:
            print()  # ends the prompt's line
            return
        if echo:
            print(name, flush=True)
        yield name


def run(args) -> int:
    stats = detection(args)
    # At the prompt a failed name was answered "Try again!"; named up front, a failed image fails the command.
    return 1 if stats.get("failed") and args.image else 0


def detection(args) -> dict:
    """What the command does, returning its counts (images or frames, boxes, where the output went)."""
    video, output = _video_and_output(args)
    # An official net's name (`--model yolov3-tiny`) is its Darknet file, downloaded once.
    weights = resolve_weights(args.weights) or DEFAULT_MODEL_PATH
    rule, image_folder = _checked_outputs(args, weights, video, output)
    if args.show:
        media.check_display()  # a headless machine fails here, before a model is built or a frame written
    quiet.import_tensorflow(args.verbose)
    from keras_yolo_mgpu.inference.export_formats import open_detector

    weights = darknet_as_keras(weights)

    yolo = open_detector(
        weights,
        **cli.detector_params(args, weights),
        gpu_num=args.gpu_num,
        batch_size=args.batch_size,
    )
    if args.image is not None:
        return _detect_images(yolo, args, image_folder, rule)
    return _detect_video(yolo, args, video, output, rule)


def _checked_outputs(args, weights: str, video: str | None, output: str | None):
    """`(the output rule, the folder for annotated images)`, every output checked before any input is read.

    Cheap checks first: a typo or a refused output fails before the model is built.
    """
    if not os.path.exists(weights):  # a SavedModel export is a folder
        raise FileNotFoundError(missing_model_message(weights, "--model {}"))
    rule = media.OutputRule([weights, args.classes, args.anchors], overwrite=args.overwrite)
    image_folder = output or "detections"
    if args.image:
        media.check_image_outputs(media.collect_images(args.image), image_folder, args.save_json, rule)
    elif args.image is not None:
        if args.save_json:
            rule.check(args.save_json, "--save-json")
    else:
        media.check_video_outputs(video, output, args.save_json, rule)
        check_video_input(video)
    return rule, image_folder


def _detect_images(yolo, args, image_folder: str, rule) -> dict:
    """--image: the named images, or keras-yolo3's prompt for file names."""
    if args.image:
        stats = media.process_images(
            yolo, args.image, image_folder, save_json=args.save_json, progress=not args.no_progress, rule=rule
        )
    else:
        logger.info("image mode: type an image file name at the prompt, end with Ctrl-D (end of input)")
        stats = media.process_image_names(
            yolo, _typed_names(), image_folder, save_json=args.save_json, show=args.show, rule=rule
        )
    logger.info(
        "%s, %s, annotated images in %s%s",
        counted(stats["images"], "images"),
        counted(stats["detections"], "boxes"),
        stats["output_dir"],
        f"; {stats['failed']} unreadable or refused" if stats["failed"] else "",
    )
    return stats


def _detect_video(yolo, args, video: str, output: str | None, rule) -> dict:
    """A video file, stream or camera, annotated into `output`."""
    if not output and not args.save_json and not args.show:
        logger.warning("no output path, --save-json or --show: detections are counted but not saved")
    stats = media.process_video(
        yolo,
        video,
        output,
        batch_size=args.batch_size,
        show=args.show,
        save_json=args.save_json,
        max_frames=args.max_frames,
        progress=not args.no_progress,
        rule=rule,
    )
    logger.info(
        "%s in %.1f s (%.2f fps), %s%s",
        counted(stats["frames"], "frames"),
        stats["seconds"],
        stats["fps"],
        counted(stats["detections"], "boxes"),
        f", video written to {stats['output']}" if stats["output"] else "",
    )
    return stats


def main(argv: Sequence[str] | None = None, settings: Mapping[str, object] | None = None) -> int:
    """`python yolo_video.py`; `settings`: what yolo_video.py sets in its file (keras-yolo3's `YOLO._defaults`)."""
    settings = ScriptSettings("yolo_video.py", settings or {}, names=DETECT_SETTINGS, dataset=())
    # RuntimeError: --show without a display, VideoError (a RuntimeError): unreadable input or no codec.
    return run_with_settings(build_parser, run, settings, argv, expected_errors=(RuntimeError,))


if __name__ == "__main__":
    sys.exit(main())
