"""Detection on images and video: the library behind `yolo_video.py` (`cli/detect.py`).

`process_video` overlaps the three stages of a video: a reader thread
decodes and letterboxes; the calling thread runs the model on batches of
whatever frames are ready; a writer thread draws and encodes. Frames stay in
OpenCV's BGR order from decoder to encoder (no full-size conversion either
way); the model gets RGB: each letterboxed frame is converted, which is what
keras-yolo3 forgot. Every output goes through an `OutputRule`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import cv2
import numpy as np
from PIL import UnidentifiedImageError

from keras_yolo_mgpu import outputs
from keras_yolo_mgpu.data.images import read_image
from keras_yolo_mgpu.data.letterbox import letterbox_array
from keras_yolo_mgpu.fileio import atomic_write
from keras_yolo_mgpu.inference.video import VideoReader, VideoWriter, planned_video_path
from keras_yolo_mgpu.progress import progress_bar
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")
_SHOW_WINDOW = "keras-yolo-mgpu"
_IMAGE_ERRORS = (OSError, UnidentifiedImageError, ValueError)


class OutputRule:
    """`keras_yolo_mgpu.outputs`'s rule for one command run, and the files it wrote.

    Each path is checked once: a file written earlier in the same run (the
    same image named twice at the prompt) is replaced without asking again.

    Args:
        inputs: the run's input files (the weights, classes, anchors ...);
            the functions here add their own (the video, the images).
        overwrite: the user's `--overwrite`.
        strict: False for a Python caller's default: an existing file is
            replaced, as `cv2.imwrite` would (an input still never is).
    """

    def __init__(self, inputs: Iterable[str | os.PathLike | None] = (), *, overwrite: bool = False, strict=True):
        self.inputs: list[str] = []
        self.add_inputs(inputs)
        self.overwrite = overwrite
        self.strict = strict
        self.written: list[str] = []
        self._checked: set[str] = set()

    def add_inputs(self, inputs: Iterable[str | os.PathLike | int | None]) -> None:
        """Adds input files (None and camera indices are skipped)."""
        self.inputs += [os.fspath(p) for p in inputs if p is not None and not isinstance(p, int)]

    def check(self, path: str | os.PathLike, flag: str) -> None:
        """Raises `outputs.OutputIsInputError` or `OutputExistsError` unless `path` may be written.

        `flag` names the output in the message (`--output`, `annotated image`).
        """
        key = os.path.abspath(os.fspath(path))
        if key in self._checked:
            return
        try:
            outputs.check_output(path, inputs=self.inputs, overwrite=self.overwrite, flag=flag)
        except outputs.OutputExistsError:
            if self.strict or os.path.isdir(path):
                raise
        self._checked.add(key)

    def wrote(self, path: str | os.PathLike) -> None:
        self.written.append(os.fspath(path))

    def record(self) -> None:
        """Records the files written so far as this project's (`outputs.record_written`), once."""
        written, self.written = self.written, []
        if written:
            outputs.record_written(dict.fromkeys(written))


def _check_all(rule: OutputRule, targets: Iterable[tuple[str, str]]) -> None:
    """`rule.check` of every (path, flag); the first refusal is raised, saying how many more there are."""
    errors = []
    for path, flag in targets:
        try:
            rule.check(path, flag)
        except (outputs.OutputIsInputError, outputs.OutputExistsError) as error:
            errors.append(error)
    if errors:
        more = f" (and {len(errors) - 1} more outputs refused alike)" if len(errors) > 1 else ""
        raise type(errors[0])(f"{errors[0]}{more}")


def _json_sink(path: str | None):
    if not path:
        return contextlib.nullcontext(None)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open(path, "w", encoding="utf-8")


def _show(frame_bgr: np.ndarray) -> bool:
    """Shows a BGR frame; False when the user pressed q or Esc."""
    try:
        cv2.imshow(_SHOW_WINDOW, frame_bgr)
        return cv2.waitKey(1) & 0xFF not in (ord("q"), 27)
    except cv2.error as error:
        raise _no_display(error) from None


def check_display() -> None:
    """Opens `--show`'s window, or raises its error before any model is built or output written."""
    try:
        cv2.namedWindow(_SHOW_WINDOW)
    except cv2.error as error:
        raise _no_display(error) from None


def _no_display(error: cv2.error) -> RuntimeError:
    return RuntimeError(
        "--show needs a display and an OpenCV build with GUI support "
        "(pip install opencv-python instead of opencv-python-headless): "
        f"{error.msg if hasattr(error, 'msg') else error}"
    )


def check_video_outputs(
    source: str | int, output_path: str | None, save_json: str | None, rule: OutputRule
) -> str | None:
    """Checks the outputs of `process_video` under `rule` before anything is read; returns the video's path.

    Raises:
        outputs.OutputIsInputError, outputs.OutputExistsError: see `outputs.check_output`.
        ValueError: the video and the JSON lines would be the same file.
    """
    rule.add_inputs([source])
    planned = planned_video_path(output_path) if output_path else None
    if planned and save_json and os.path.abspath(planned) == os.path.abspath(save_json):
        raise ValueError(f"--output and --save-json both name {save_json}: give two files")
    _check_all(rule, [(p, f) for p, f in ((planned, "--output"), (save_json, "--save-json")) if p])
    return planned


def process_video(
    yolo,
    source: str | int,
    output_path: str | None = None,
    *,
    batch_size: int | None = None,
    show: bool = False,
    save_json: str | None = None,
    max_frames: int | None = None,
    progress: bool = True,
    rule: OutputRule | None = None,
) -> dict:
    """Detects objects in every frame of a video file, camera or network stream.

    Args:
        yolo: a `detector.YOLO`.
        source: video file, camera index (int or digit string), or a
            `rtsp://`, `rtmp://`, `http(s)://` stream.
        output_path: annotated video to write (same size and frame rate as
            the input; `mp4v`, falling back to `.avi`/`MJPG`); None writes none.
            Written under a temporary name and renamed at the end: an
            interrupted run or a dropped stream keeps the frames so far.
        batch_size: most frames per forward pass (default: `yolo.batch_size`).
        show: show frames in a window (needs a display); q or Esc stops.
        save_json: write one JSON line per frame:
            `{"frame", "time", "detections": [{"class_id", "class", "score", "box"}]}`.
        max_frames: stop after this many frames (cameras never end).
        progress: show a progress bar with the frame rate.
        rule: what the outputs may replace (default: anything but `source`);
            checked before `source` is opened.

    Returns:
        `{"frames", "seconds", "fps", "detections", "output", "input_fps",
        "size", "input_ended_early"}`; `input_ended_early` is True when the
        input stopped before the frames its header announced, or a live
        stream or camera stopped (a warning says so).

    Raises:
        video.VideoError: the input cannot be opened or read, or no codec
            can write the output.
        outputs.OutputIsInputError, outputs.OutputExistsError: see `rule`.
    """
    rule = rule if rule is not None else OutputRule(strict=False)
    planned = check_video_outputs(source, output_path, save_json, rule)
    batch_size = batch_size or yolo.batch_size
    model_size = yolo.model_image_size

    def model_input(frame_bgr):  # on the reader thread
        return cv2.cvtColor(letterbox_array(frame_bgr, model_size), cv2.COLOR_BGR2RGB)

    reader = VideoReader(source, transform=model_input, rgb=False, max_frames=max_frames)
    writer = None
    frames = boxes = 0
    stopped = interrupted = False
    start = time.perf_counter()
    try:
        if planned:
            writer = VideoWriter(
                planned,
                reader.fps,
                reader.size,
                transform=lambda frame, detections: np.asarray(yolo.draw(frame, detections, bgr=True)),
                rgb=False,
                check=lambda path: rule.check(path, "--output"),
            )
        logger.info(
            "%s: %dx%d at %.2f fps%s -> %s",
            reader.name,
            *reader.size,
            reader.fps,
            f", {reader.frame_count} frames" if reader.frame_count else "",
            writer.path if writer else "(no output video)",
        )
        with (
            _json_sink(save_json) as sink,
            progress_bar(reader.frame_count, unit="frame", desc="detect", enabled=progress, dynamic_ncols=True) as bar,
        ):
            if sink is not None:
                rule.wrote(save_json)
            for batch in reader.batches(batch_size):
                detections = yolo.detect_letterboxed(np.stack([b[2] for b in batch]), [b[1].shape[:2] for b in batch])
                for (index, frame, _), found in zip(batch, detections):
                    if writer is not None:
                        writer.write(frame, found)
                    if sink is not None:
                        record = {
                            "frame": index,
                            "time": round(index / reader.fps, 4),
                            "detections": found.to_records(yolo.class_names),
                        }
                        sink.write(json.dumps(record) + "\n")
                    if show and not _show(np.asarray(yolo.draw(frame, found, bgr=True))):
                        stopped = True
                        break
                    boxes += found.num_boxes
                frames += len(batch)
                bar.update(len(batch))
                bar.set_postfix(fps=f"{frames / max(time.perf_counter() - start, 1e-9):.1f}", refresh=False)
                if stopped:
                    break
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        reader.close()
        try:
            if writer is not None:
                writer.close()  # renames the frames so far onto the output, on an error too
        finally:
            if writer is not None and writer.saved:
                rule.wrote(writer.path)
                if interrupted:
                    logger.warning("interrupted: %s keeps the %d frames written", writer.path, writer.frames_written)
            rule.record()
            if show:
                with contextlib.suppress(cv2.error):
                    cv2.destroyWindow(_SHOW_WINDOW)
    ended_early = not stopped and _report_early_end(reader, frames, writer)
    seconds = time.perf_counter() - start
    return {
        "frames": frames,
        "seconds": seconds,
        "fps": frames / seconds if seconds > 0 else 0.0,
        "detections": boxes,
        "output": writer.path if writer is not None and writer.saved else None,
        "input_fps": reader.fps,
        "size": list(reader.size),
        "input_ended_early": ended_early,
    }


def detect_video(yolo, video_path: str | int, output_path: str = "") -> dict:
    """keras-yolo3's `detect_video(yolo, video_path, output_path="")`, for scripts written against its yolo.py.

    Every frame of the video, camera or stream is detected and shown in a
    window (q or Esc stops), and written to `output_path` when one is given;
    the session is closed at the end, as keras-yolo3 did. keras-yolo3 failed
    on a machine without a display: there the frames are not shown (said in
    the log). The output follows the commands' rule: never the input, and a
    file this project did not write only with yolo_video.py's --overwrite.

    Returns:
        `process_video`'s counts.
    """
    try:
        check_display()
        show = True
    except RuntimeError:
        logger.warning("no display: the frames are not shown%s", f" (written to {output_path})" if output_path else "")
        show = False
    try:
        return process_video(yolo, video_path, output_path or None, show=show)
    finally:
        yolo.close_session()


def _report_early_end(reader: VideoReader, frames: int, writer: VideoWriter | None) -> bool:
    """Warns when the input stopped before its announced end (a dropped stream, a cut file); True then."""
    if not reader.input_ended:
        return False
    kept = f"; {writer.path} keeps the {frames} frames detected" if writer is not None and writer.saved else ""
    error = f" ({reader.read_error})" if reader.read_error else ""
    if reader.frame_count is not None and frames < reader.frame_count:
        logger.warning(
            "%s ended after %d of the %d frames it announced: a read error%s, or the stream dropped "
            "or the file is cut short%s",
            reader.name,
            frames,
            reader.frame_count,
            error,
            kept,
        )
        return True
    if reader.frame_count is None and (reader.is_stream or isinstance(reader.source, int)):
        what = "camera" if isinstance(reader.source, int) else "stream"
        logger.warning(
            "%s stopped sending frames after %d frames (the %s ended or dropped%s)%s",
            reader.name,
            frames,
            what,
            error,
            kept,
        )
        return True
    if reader.read_error:
        logger.warning(
            "%s: a frame failed to decode after %d frames (%s)%s", reader.name, frames, reader.read_error, kept
        )
        return True
    return False


def collect_images(inputs: Iterable[str]) -> list[str]:
    """Image files named in `inputs`: files as given, folders' images sorted.

    Raises:
        FileNotFoundError: an input does not exist, or a folder holds no image.
    """
    found = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            images = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
            if not images:
                raise FileNotFoundError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in folder {path}")
            found += [str(p) for p in images]
        elif path.is_file():
            found.append(str(path))
        else:
            raise FileNotFoundError(f"image not found: {path}")
    return found


def _output_image_path(image_path: str, output_dir: Path) -> Path:
    target = output_dir / Path(image_path).name
    if target.resolve() == Path(image_path).resolve():  # never overwrite the input
        target = target.with_name(f"{target.stem}_detected{target.suffix}")
    return target


def _save_annotated(image, target: Path, rule: OutputRule) -> None:
    # Through a temporary file: an interrupted save never leaves half an
    # image over an earlier output. PIL takes the format from the ending,
    # which the temporary name keeps.
    atomic_write(target, image.save)
    rule.wrote(target)


def process_images(
    yolo,
    inputs: Sequence[str],
    output_dir: str | None = "detections",
    *,
    save_json: str | None = None,
    progress: bool = True,
    rule: OutputRule | None = None,
) -> dict:
    """Detects objects in image files and writes annotated copies.

    Every annotated image's file is checked under `rule` before the first
    image is read: one refused output stops the run before any work.

    Args:
        yolo: a `detector.YOLO`.
        inputs: image files and/or folders (their images, not recursive).
        output_dir: where annotated images go, under their own names (an
            image that lies in `output_dir` itself gets `_detected` added:
            an input is never overwritten; None writes none).
        save_json: write one JSON line per image:
            `{"image", "width", "height", "detections": [...]}`.
        rule: what the outputs may replace (default: anything but the inputs).

    Returns:
        `{"images", "failed", "detections", "seconds", "output_dir"}`;
        unreadable images are logged and counted in `failed`.

    Raises:
        FileNotFoundError: see `collect_images`.
        outputs.OutputIsInputError, outputs.OutputExistsError: see `rule`.
        ValueError: two images would be written to the same file.
    """
    paths = collect_images(inputs)
    rule = rule if rule is not None else OutputRule(strict=False)
    targets = check_image_outputs(paths, output_dir, save_json, rule)
    out = Path(output_dir) if output_dir else None
    start = time.perf_counter()
    done = failed = boxes = 0
    try:
        with (
            _json_sink(save_json) as sink,
            progress_bar(len(paths), unit="image", desc="detect", enabled=progress) as bar,
        ):
            if sink is not None:
                rule.wrote(save_json)
            for first in range(0, len(paths), yolo.batch_size):
                batch = []
                for path in paths[first : first + yolo.batch_size]:
                    try:
                        batch.append((path, read_image(path)))
                    except _IMAGE_ERRORS as error:
                        logger.error("cannot read image %s: %s", path, error)
                        failed += 1
                        bar.update(1)
                if not batch:
                    continue
                for (path, image), found in zip(batch, yolo.detect_batch([image for _, image in batch])):
                    if out is not None:
                        _save_annotated(yolo.draw(image, found), targets[path], rule)
                    if sink is not None:
                        sink.write(json.dumps(_image_record(path, image, found, yolo.class_names)) + "\n")
                    logger.debug("%s: %d boxes", path, found.num_boxes)
                    boxes += found.num_boxes
                    done += 1
                    bar.update(1)
    finally:
        rule.record()
    return _summary(done, failed, boxes, start, out)


def check_image_outputs(
    paths: Sequence[str], output_dir: str | None, save_json: str | None, rule: OutputRule
) -> dict[str, Path]:
    """Checks every output of `process_images` under `rule`; returns each image's annotated file.

    Args:
        paths: the image files (`collect_images`).
        output_dir: the folder for annotated images (None: none written); for one image, a path with an image
            ending that is no folder names the annotated file itself.
        save_json: the JSON lines file, or None.
        rule: the output rule; `paths` are added to its inputs.

    Returns:
        image path -> annotated file (empty without `output_dir`).

    Raises:
        outputs.OutputIsInputError, outputs.OutputExistsError: see `outputs.check_output`.
        ValueError: two images would be annotated into the same file.
        FileExistsError: `output_dir` is a file (not an image to replace).
    """
    rule.add_inputs(paths)
    out = Path(output_dir) if output_dir else None
    if out is not None and out.suffix.lower() in IMAGE_EXTENSIONS and not out.is_dir():
        # `--output result.jpg`: a file, as a user naming one picture means it, not a folder of that name.
        if len(paths) != 1:
            raise ValueError(
                f"--output {output_dir} names one image file, and {len(paths)} images were given: "
                "give a folder for their annotated copies"
            )
        targets = {paths[0]: out}
    else:
        if out is not None and out.exists() and not out.is_dir():
            raise FileExistsError(
                f"--output {output_dir} is a file: the annotated images go into a folder (or, for one image, "
                "a file with an image ending)"
            )
        targets = {path: _output_image_path(path, out) for path in paths} if out is not None else {}
    seen: dict[Path, str] = {}
    for path, target in targets.items():
        key = Path(os.path.abspath(target))
        if key in seen:
            raise ValueError(
                f"{seen[key]} and {path} would both be annotated into {target}: "
                "give images with different names, or detect them in two runs with different --output folders"
            )
        seen[key] = path
    checks = [(str(target), "annotated image") for target in targets.values()]
    _check_all(rule, checks + ([(save_json, "--save-json")] if save_json else []))
    return targets


def _summary(done: int, failed: int, boxes: int, start: float, out: Path | None) -> dict:
    return {
        "images": done,
        "failed": failed,
        "detections": boxes,
        "seconds": time.perf_counter() - start,
        "output_dir": str(out) if out else None,
    }


def _image_record(path: str, image: np.ndarray, found, class_names) -> dict:
    return {
        "image": path,
        "width": image.shape[1],
        "height": image.shape[0],
        "detections": found.to_records(class_names),
    }


def _typed_path(name: str) -> str:
    """A file name as typed: surrounding spaces and the quotes a terminal adds to a dropped file removed.

    Where no file has the name as typed, a shell's reading of it (`with\\ space.jpg`, as macOS's Terminal drops
    a file) is taken when that names one.
    """
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "'\"":
        return name[1:-1]
    if "\\" in name and not os.path.exists(name):
        try:
            words = shlex.split(name)
        except ValueError:  # an unclosed quote: the name as typed
            return name
        if len(words) == 1 and os.path.exists(words[0]):
            return words[0]
    return name


def process_image_names(
    yolo,
    names: Iterable[str],
    output_dir: str | None = "detections",
    *,
    save_json: str | None = None,
    show: bool = False,
    rule: OutputRule | None = None,
) -> dict:
    """Detects objects in each image file named by `names`, as they come (keras-yolo3's image loop).

    An empty name is skipped. A name that cannot be read, or whose annotated
    file `rule` refuses, is logged (keras-yolo3's "Open Error! Try again!")
    and the loop goes on to the next name. Each annotated image's path is
    logged; the files written are recorded once, at the end (an error or
    Ctrl-C included).

    Args:
        yolo: a `detector.YOLO`.
        names: image file names, e.g. lines typed at a prompt; the loop ends
            when they do.
        output_dir: where annotated images go (see `process_images`).
        save_json: write one JSON line per image (see `process_images`).
        show: show each annotated image in a window (needs a display).
        rule: what the outputs may replace (default: anything but the inputs).

    Returns:
        `{"images", "failed", "detections", "seconds", "output_dir"}`.
    """
    rule = rule if rule is not None else OutputRule(strict=False)
    out = Path(output_dir) if output_dir else None
    if save_json:
        rule.check(save_json, "--save-json")
    start = time.perf_counter()
    done = failed = boxes = 0
    try:
        with _json_sink(save_json) as sink:
            if sink is not None:
                rule.wrote(save_json)
            for name in names:
                path = _typed_path(name)
                if not path:
                    continue
                try:
                    image = _read_named_image(path)
                except _IMAGE_ERRORS as error:
                    logger.error("Open Error! Try again! %s", error)
                    failed += 1
                    continue
                rule.add_inputs([path])
                target = _output_image_path(path, out) if out is not None else None
                try:
                    if target is not None:
                        rule.check(target, "annotated image")
                except (outputs.OutputIsInputError, outputs.OutputExistsError) as error:
                    logger.error("%s; %s skipped, try again", error, path)
                    failed += 1
                    continue
                found = yolo.detect(image)
                drawn = yolo.draw(image, found)
                try:
                    if target is not None:
                        _save_annotated(drawn, target, rule)
                except (OSError, ValueError) as error:  # PIL: no format for the name's ending, a full disk
                    logger.error("cannot write %s: %s; try again", target, error)
                    failed += 1
                    continue
                if sink is not None:
                    sink.write(json.dumps(_image_record(path, image, found, yolo.class_names)) + "\n")
                    sink.flush()  # the next name may never come (Ctrl-C at the prompt)
                logger.info(
                    "%s: %s%s", path, counted(found.num_boxes, "boxes"), f", annotated image {target}" if target else ""
                )
                if show:
                    _show(np.asarray(drawn)[..., ::-1])
                boxes += found.num_boxes
                done += 1
    finally:
        rule.record()
        if show:
            with contextlib.suppress(cv2.error):
                cv2.destroyWindow(_SHOW_WINDOW)
    return _summary(done, failed, boxes, start, out)


def _read_named_image(path: str) -> np.ndarray:
    """`read_image`, with a short reason for a name that is no file."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a folder: name an image file")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such image file: {path}")
    try:
        return read_image(path)
    except _IMAGE_ERRORS as error:
        raise OSError(f"cannot read image {path}: {error}") from None
