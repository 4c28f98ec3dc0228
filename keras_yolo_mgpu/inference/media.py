"""Detection on images and video: the library behind `yolo_video.py` (`cli/detect.py`).

`process_video` overlaps the three stages of a video: a reader thread
decodes and letterboxes; the calling thread runs the model on batches of
whatever frames are ready; a writer thread draws and encodes. Frames stay in
OpenCV's BGR order from decoder to encoder (no full-size conversion either
way); the model gets RGB: each letterboxed frame is converted, which is what
keras-yolo3 forgot. `process_images` annotates image files. Both can write every
detection as JSON lines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import cv2
import numpy as np
from PIL import UnidentifiedImageError
from tqdm import tqdm

from keras_yolo_mgpu.data.images import read_image

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")
_SHOW_WINDOW = "keras-yolo-mgpu"


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
        raise RuntimeError(
            "--show needs a display and an OpenCV build with GUI support "
            "(pip install opencv-python instead of opencv-python-headless): "
            f"{error.msg if hasattr(error, 'msg') else error}"
        ) from None


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
) -> dict:
    """Detects objects in every frame of a video file or camera.

    Args:
        yolo: a `detector.YOLO`.
        source: video file, or camera index (int or digit string).
        output_path: annotated video to write (same size and frame rate as
            the input; `mp4v`, falling back to `.avi`/`MJPG`); None writes none.
        batch_size: most frames per forward pass (default: `yolo.batch_size`).
        show: show frames in a window (needs a display); q or Esc stops.
        save_json: write one JSON line per frame:
            `{"frame", "time", "detections": [{"class_id", "class", "score", "box"}]}`.
        max_frames: stop after this many frames (cameras never end).
        progress: show a progress bar with the frame rate.

    Returns:
        `{"frames", "seconds", "fps", "detections", "output", "input_fps", "size"}`.

    Raises:
        video.VideoError: the input cannot be opened or read, or no codec
            can write the output.
    """
    from keras_yolo_mgpu.data.letterbox import letterbox_array
    from keras_yolo_mgpu.inference.video import VideoReader, VideoWriter

    batch_size = batch_size or yolo.batch_size
    model_size = yolo.model_image_size

    def model_input(frame_bgr):  # on the reader thread
        return cv2.cvtColor(letterbox_array(frame_bgr, model_size), cv2.COLOR_BGR2RGB)

    reader = VideoReader(source, transform=model_input, rgb=False, max_frames=max_frames)
    writer = None
    frames = boxes = 0
    start = time.perf_counter()
    try:
        if output_path:
            writer = VideoWriter(
                output_path,
                reader.fps,
                reader.size,
                transform=lambda frame, detections: np.asarray(yolo.draw(frame, detections, bgr=True)),
                rgb=False,
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
            tqdm(
                total=reader.frame_count, unit="frame", disable=not progress, dynamic_ncols=True, desc="detect"
            ) as bar,
        ):
            stop = False
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
                        stop = True
                        break
                    boxes += found.num_boxes
                frames += len(batch)
                bar.update(len(batch))
                bar.set_postfix(fps=f"{frames / max(time.perf_counter() - start, 1e-9):.1f}", refresh=False)
                if stop:
                    break
        if writer is not None:
            writer.close()
    finally:
        reader.close()
        if writer is not None:
            writer.close()
        if show:
            with contextlib.suppress(cv2.error):
                cv2.destroyWindow(_SHOW_WINDOW)
    seconds = time.perf_counter() - start
    return {
        "frames": frames,
        "seconds": seconds,
        "fps": frames / seconds if seconds > 0 else 0.0,
        "detections": boxes,
        "output": writer.path if writer else None,
        "input_fps": reader.fps,
        "size": list(reader.size),
    }


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


def process_images(
    yolo,
    inputs: Sequence[str],
    output_dir: str | None = "detections",
    *,
    save_json: str | None = None,
    progress: bool = True,
) -> dict:
    """Detects objects in image files and writes annotated copies.

    Args:
        yolo: a `detector.YOLO`.
        inputs: image files and/or folders (their images, not recursive).
        output_dir: where annotated images go, under their own names (None
            writes none).
        save_json: write one JSON line per image:
            `{"image", "width", "height", "detections": [...]}`.

    Returns:
        `{"images", "failed", "detections", "seconds", "output_dir"}`;
        unreadable images are logged and counted in `failed`.
    """
    paths = collect_images(inputs)
    out = Path(output_dir) if output_dir else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    done = failed = boxes = 0
    with (
        _json_sink(save_json) as sink,
        tqdm(total=len(paths), unit="image", disable=not progress, desc="detect") as bar,
    ):
        for first in range(0, len(paths), yolo.batch_size):
            batch = []
            for path in paths[first : first + yolo.batch_size]:
                try:
                    batch.append((path, read_image(path)))
                except (OSError, UnidentifiedImageError, ValueError) as error:
                    logger.error("cannot read image %s: %s", path, error)
                    failed += 1
                    bar.update(1)
            if not batch:
                continue
            for (path, image), found in zip(batch, yolo.detect_batch([image for _, image in batch])):
                if out is not None:
                    yolo.draw(image, found).save(_output_image_path(path, out))
                if sink is not None:
                    record = {
                        "image": path,
                        "width": image.shape[1],
                        "height": image.shape[0],
                        "detections": found.to_records(yolo.class_names),
                    }
                    sink.write(json.dumps(record) + "\n")
                logger.debug("%s: %d boxes", path, found.num_boxes)
                boxes += found.num_boxes
                done += 1
                bar.update(1)
    return {
        "images": done,
        "failed": failed,
        "detections": boxes,
        "seconds": time.perf_counter() - start,
        "output_dir": str(out) if out else None,
    }
