"""`python yolo_video.py`: detect objects in images or a video (keras-yolo3's flags).

python yolo_video.py --model W --input clip.mp4 --output out.mp4
python yolo_video.py --model W --image photos/ --output annotated/
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from keras_yolo_mgpu.cli import args as cli
from keras_yolo_mgpu.cli.runner import run_command

logger = logging.getLogger("yolo_video")


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="yolo_video.py",
        description="Detect objects in images or a video with trained YOLOv3 weights, or with an exported model "
        "(SavedModel folder, .tflite, .onnx, beside its .metadata.json) (keras-yolo3's flags).",
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
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--image", nargs="+", metavar="PATH", help="image files and/or folders to annotate")
    source.add_argument("--input", metavar="VIDEO", help="video file, or camera index (0, 1, ...)")
    parser.add_argument(
        "--output",
        metavar="PATH",
        help="with --input: the annotated video (.mp4 with mp4v, .avi with MJPG); "
        "with --image: the folder for annotated images (default: detections)",
    )
    parser.add_argument("--show", action="store_true", help="show the frames in a window (off: the tool runs headless)")
    parser.add_argument(
        "--save-json", metavar="FILE", help="write the detections of every frame or image as JSON lines"
    )
    parser.add_argument("--max-frames", type=cli.positive_int, default=None, help="stop after this many video frames")
    return parser


def run(args) -> int:
    from keras_yolo_mgpu.cli import quiet
    from keras_yolo_mgpu.inference.media import collect_images, process_images, process_video
    from keras_yolo_mgpu.inference.video import parse_source

    weights = args.weights or os.path.join("model_data", "yolo.h5")
    # Cheap checks first: a typo fails before the model is built.
    if not os.path.exists(weights):  # a SavedModel export is a folder
        hint = "" if args.weights else " (the default; pass --model FILE)"
        raise FileNotFoundError(f"model weights not found: {weights}{hint}")
    if args.image:
        collect_images(args.image)
    else:
        parse_source(args.input)
    quiet.import_tensorflow(args.verbose)
    from keras_yolo_mgpu.inference.export_formats import open_detector

    yolo = open_detector(
        weights,
        **cli.detector_params(args, weights),
        gpu_num=args.gpu_num,
        batch_size=args.batch_size,
    )
    if args.image:
        stats = process_images(
            yolo, args.image, args.output or "detections", save_json=args.save_json, progress=not args.no_progress
        )
        logger.info(
            "%d images, %d boxes, annotated images in %s%s",
            stats["images"],
            stats["detections"],
            stats["output_dir"],
            f"; {stats['failed']} unreadable" if stats["failed"] else "",
        )
        return 1 if stats["failed"] else 0
    if not args.output and not args.save_json and not args.show:
        logger.warning("no --output, --save-json or --show: detections are counted but not saved")
    stats = process_video(
        yolo,
        args.input,
        args.output,
        batch_size=args.batch_size,
        show=args.show,
        save_json=args.save_json,
        max_frames=args.max_frames,
        progress=not args.no_progress,
    )
    logger.info(
        "%d frames in %.1f s (%.2f fps), %d boxes%s",
        stats["frames"],
        stats["seconds"],
        stats["fps"],
        stats["detections"],
        f", video written to {stats['output']}" if stats["output"] else "",
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # RuntimeError: --show without a display, VideoError (a RuntimeError): unreadable input or no codec.
    return run_command(build_parser, run, argv, expected_errors=(RuntimeError,))


if __name__ == "__main__":
    sys.exit(main())
