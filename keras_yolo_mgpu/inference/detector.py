"""`YOLO`: load trained weights, detect objects in images and video frames.

keras-yolo3's detector class with its constructor arguments, on a model
built for inference (never the training model): the body from
`model.build_body` with its batch normalisations folded into the
convolutions (`model.batch_norm.fold_batch_norm`; `YOLO.from_body` shares
the body it is given as it is), then the `YoloDecode` and `YoloNMS` layers. Any file
`checkpoints.load_weights` reads loads, whatever machine wrote it: this
project's checkpoints from a 4-GPU run, Keras 2 `.h5` files from keras-yolo3
(nested `multi_gpu_model` files included) and `convert.py` output.

`gpu_num > 1` spreads a batch of frames over that many GPUs, each image
whole on one GPU. How the model runs on the devices is the backend's
(`backend/{jax,tensorflow}/inference.py`); TensorFlow is needed only on the
TensorFlow backend.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import NamedTuple

import keras
import numpy as np
from PIL import Image

from keras_yolo_mgpu.backend import inference as backend_inference
from keras_yolo_mgpu.data.images import to_rgb_array
from keras_yolo_mgpu.data.letterbox import letterbox_array
from keras_yolo_mgpu.inference.draw import class_colors, draw_detections
from keras_yolo_mgpu.inference.layers import build_detection_model
from keras_yolo_mgpu.model.architectures import get_architecture
from keras_yolo_mgpu.model.batch_norm import fold_batch_norm
from keras_yolo_mgpu.model.yolo3 import build_body, check_input_shape
from keras_yolo_mgpu.resources import DEFAULT_MODEL_PATH, missing_model_message
from keras_yolo_mgpu.weights.download import resolve_weights
from keras_yolo_mgpu.weights.loading import load_weights
from keras_yolo_mgpu.weights.metadata import make_metadata, settings_for
from keras_yolo_mgpu.weights.start_weights import darknet_as_keras
from keras_yolo_mgpu.wording import counted

logger = logging.getLogger(__name__)

# The keys of keras-yolo3's yolo_video.py namespace, which its users pass on as `YOLO(**vars(FLAGS))`: its model
# flags under their flag names (keras-yolo3's YOLO kept them unread, so its --model never chose the weights; here they
# do), and its mode flags, which are the script's, not the detector's.
KERAS_YOLO3_FLAG_NAMES = {"model": "model_path", "anchors": "anchors_path", "classes": "classes_path"}
KERAS_YOLO3_MODE_FLAGS = ("image", "input", "output")


class Detections(NamedTuple):
    """Detections in one image, best score first.

    Attributes:
        boxes: (K, 4) float32 x_min, y_min, x_max, y_max in original image
            pixels, clipped to the image.
        scores: (K,) float32.
        classes: (K,) int32 class indices.
    """

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    @property
    def num_boxes(self) -> int:
        return len(self.scores)

    def to_records(self, class_names: Sequence[str]) -> list[dict]:
        """JSON-ready list: `{"class_id", "class", "score", "box": [x1, y1, x2, y2]}`."""
        return [
            {
                "class_id": int(c),
                "class": class_names[int(c)] if 0 <= int(c) < len(class_names) else str(int(c)),
                "score": round(float(s), 5),
                "box": [round(float(v), 2) for v in b],
            }
            for b, s, c in zip(self.boxes, self.scores, self.classes)
        ]


def load_body(model_path: str, anchors, num_classes: int, kind: str | None = None) -> keras.Model:
    """A fresh inference body (`model.build_body`) with weights from `model_path`.

    Args:
        model_path: any file `checkpoints.load_weights` reads.
        anchors: (9, 2) for YOLOv3 or (6, 2) for tiny YOLOv3.
        kind: the network (`model.architectures.MODEL_NAMES`); None picks
            YOLOv3 or tiny YOLOv3 by anchor count.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file holds another network, naming the likely cause.
    """
    model_path = os.fspath(model_path)
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"model weights not found: {model_path}")
    body = build_body(anchors, num_classes, model=kind)
    try:
        load_weights(body, model_path)
    except (ValueError, KeyError) as error:
        network = kind or ("yolov3-tiny" if len(anchors) == 6 else "yolov3")
        raise ValueError(
            f"cannot load {model_path} into a {network} with {counted(num_classes, 'classes')}: {error} "
            "Check that --model, --anchors and --classes match the ones the weights were trained with."
        ) from None
    return body


def inference_devices(gpu_num: int) -> list:
    """The devices a detector spreads its batches over: `gpu_num` GPUs, else as many CPU devices.

    TensorFlow: device names, `[None]` (default placement) for one. JAX:
    `jax.Device`s, the default device for one.

    Raises:
        ValueError: fewer devices than `gpu_num`.
    """
    if gpu_num < 1:
        raise ValueError(f"gpu_num must be >= 1. Received: gpu_num={gpu_num}")
    if gpu_num == 1:
        return [backend_inference.default_device()]
    gpus, cpus = backend_inference.local_devices()
    if len(gpus) >= gpu_num:
        return gpus[:gpu_num]
    if not gpus and len(cpus) >= gpu_num:
        # Logical (TF) or simulated (JAX) CPU devices: a rehearsal.
        logger.info("no GPU: spreading frames over %d CPU devices", gpu_num)
        return cpus[:gpu_num]
    names = ", ".join(str(d) for d in gpus) or "none"
    missing = backend_inference.MISSING_GPUS.format(count=len(gpus), names=names)
    raise ValueError(f"gpu_num={gpu_num} but {missing}, or use gpu_num=1.")


def keras_yolo3_arguments(kwargs: dict) -> dict:
    """`YOLO`'s keyword arguments from keras-yolo3's (`YOLO(**vars(FLAGS))` of its yolo_video.py).

    Its flags' names become the paths they stand for, and its mode flags are
    dropped (`KERAS_YOLO3_FLAG_NAMES`, `KERAS_YOLO3_MODE_FLAGS`).

    Raises:
        TypeError: a path given under both names (a None counts as not given).
    """
    arguments = {key: value for key, value in kwargs.items() if key not in KERAS_YOLO3_MODE_FLAGS}
    for flag, name in KERAS_YOLO3_FLAG_NAMES.items():
        value = arguments.pop(flag, None)
        if value is None:
            continue
        if arguments.get(name) is not None and arguments[name] != value:
            raise TypeError(f"YOLO got {name}={arguments[name]!r} and {flag}={value!r}: give one of them")
        arguments[name] = value
    return arguments


class YOLO:
    """keras-yolo3's detector: weights in, boxes out.

    Args:
        model_path: weights to load: any file `checkpoints.load_weights`
            reads (`.weights.h5`, `.keras`, Keras 2 `.h5`), a Darknet
            `.weights` file beside its cfg (converted once, as the commands
            do), or an official net's name (`"yolov3-tiny"`, downloaded
            once: `weights.download`). When it carries
            metadata (`weights.metadata`), its anchors, masks, class names
            and input size are used; explicit arguments must agree
            (default: model_data/yolo.h5).
        anchors_path: anchors file; 9 anchors build YOLOv3, 6 tiny YOLOv3
            (default: the file's metadata, else model_data/yolo_anchors.txt).
        classes_path: class names file (default: the file's metadata, else
            model_data/coco_classes.txt).
        score: minimum score (objectness x class probability) to keep a box.
        iou: NMS IoU threshold.
        model_image_size: (height, width) network input, multiples of 32
            (default: the file's metadata, else 416x416).
        gpu_num: GPUs to spread batches of images over (one whole image per
            GPU, never split).
        max_boxes: most boxes kept per class and image (keras-yolo3: 20).
        max_detections: most boxes kept per image, all classes together.
        batch_size: images per forward pass in `detect_batch`.
        masks: anchor indices per scale (default: the file's metadata, else
            keras-yolo3's).
        settings: a complete `ModelMetadata` to use instead of reading the
            file's (what the CLIs pass after checking their flags).
        **yolo_video_flags: keras-yolo3's yolo_video.py flags as its scripts
            pass them (`YOLO(**vars(FLAGS))`): `model`, `anchors` and
            `classes` stand for the three paths; `image`, `input` and
            `output` are not the detector's and are left unread.

    Raises:
        TypeError: a keyword that is neither an argument nor one of
            keras-yolo3's yolo_video.py flags, or a path given under both names.
    """

    # keras-yolo3's `YOLO._defaults`, read through `get_defaults` (its yolo_video.py's flag help). Anchors, classes
    # and input size are the fallbacks for weights that do not record theirs.
    _defaults = {
        "model_path": DEFAULT_MODEL_PATH,
        "anchors_path": os.path.join("model_data", "yolo_anchors.txt"),
        "classes_path": os.path.join("model_data", "coco_classes.txt"),
        "score": 0.3,
        "iou": 0.45,
        "model_image_size": (416, 416),
        "gpu_num": 1,
    }

    @classmethod
    def get_defaults(cls, n: str):
        """keras-yolo3's `YOLO.get_defaults`: argument `n`'s default, else its "Unrecognized attribute name" text."""
        if n in cls._defaults:
            return cls._defaults[n]
        return "Unrecognized attribute name '" + n + "'"

    @classmethod
    def with_defaults(cls, **defaults) -> type[YOLO]:
        """A `YOLO` class whose arguments default to `defaults` (keras-yolo3's edited `YOLO._defaults`).

        Its constructor takes keywords only, as keras-yolo3's did; an argument
        given, under either name, wins over its default.

        Raises:
            TypeError: a name that is not one of `YOLO._defaults`.
        """
        unknown = sorted(set(defaults) - set(cls._defaults))
        if unknown:
            raise TypeError(f"YOLO has no default named {', '.join(unknown)}; it has {', '.join(cls._defaults)}")
        base_defaults = {**cls._defaults, **defaults}

        class EditedYOLO(cls):
            _defaults = base_defaults

            def __init__(self, **kwargs):
                given = {key: value for key, value in keras_yolo3_arguments(kwargs).items() if value is not None}
                super().__init__(**{**defaults, **given})

        EditedYOLO.__name__ = EditedYOLO.__qualname__ = "YOLO"
        return EditedYOLO

    def __init__(
        self,
        model_path: str | None = None,
        anchors_path: str | None = None,
        classes_path: str | None = None,
        score: float = 0.3,
        iou: float = 0.45,
        model_image_size: tuple[int, int] | None = None,
        gpu_num: int = 1,
        *,
        max_boxes: int = 20,
        max_detections: int = 100,
        batch_size: int = 8,
        masks=None,
        settings=None,
        **yolo_video_flags,
    ):
        unknown = sorted(set(yolo_video_flags) - {*KERAS_YOLO3_FLAG_NAMES, *KERAS_YOLO3_MODE_FLAGS})
        if unknown:
            raise TypeError(f"YOLO() got an unexpected keyword argument {unknown[0]!r}")
        paths = {"model_path": model_path, "anchors_path": anchors_path, "classes_path": classes_path}
        paths = keras_yolo3_arguments({**paths, **yolo_video_flags})
        model_path, anchors_path, classes_path = paths["model_path"], paths["anchors_path"], paths["classes_path"]
        if model_path is None:
            model_path = DEFAULT_MODEL_PATH
        model_path = darknet_as_keras(resolve_weights(os.fspath(model_path)))
        if not os.path.isfile(model_path):
            raise FileNotFoundError(missing_model_message(model_path, 'model_path="{}"'))
        if settings is None:
            settings = settings_for(
                model_path,
                classes_path=classes_path,
                anchors_path=anchors_path,
                masks=masks,
                input_shape=model_image_size,
            )
        with backend_inference.outside_distribution():  # the detector's own weights, wherever it is built
            body = fold_batch_norm(load_body(model_path, settings.anchors_array, settings.num_classes, settings.kind))
        self.model_path = model_path
        self._setup(body, settings, score, iou, gpu_num, max_boxes, max_detections, batch_size)

    @classmethod
    def from_body(
        cls,
        body: keras.Model,
        anchors,
        class_names: Sequence[str],
        score: float = 0.3,
        iou: float = 0.45,
        model_image_size: tuple[int, int] = (416, 416),
        gpu_num: int = 1,
        *,
        max_boxes: int = 20,
        max_detections: int = 100,
        batch_size: int = 8,
        masks=None,
        kind: str | None = None,
    ) -> YOLO:
        """A detector around an existing body (its weights are shared, not copied); arguments as for `YOLO`."""
        anchors = np.asarray(anchors, np.float32).reshape(-1, 2)
        kind = get_architecture(kind, len(anchors)).name
        settings = make_metadata(anchors, list(class_names), check_input_shape(model_image_size), masks, kind=kind)
        self = cls.__new__(cls)
        self.model_path = None
        self._setup(body, settings, score, iou, gpu_num, max_boxes, max_detections, batch_size)
        return self

    def _setup(self, body, settings, score, iou, gpu_num, max_boxes, max_detections, batch_size):
        """Shared by the constructors: `settings` is the body's `ModelMetadata`, the rest as for `YOLO`.

        `body` None (an exported model, `export_formats.ExportedDetector`) builds no model.
        """
        if not 0.0 <= float(score) <= 1.0 or not 0.0 <= float(iou) <= 1.0:
            raise ValueError(f"score and iou must be in [0, 1]. Received: score={score}, iou={iou}")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1. Received: batch_size={batch_size}")
        self.metadata = settings
        self.kind, self.anchors, self.masks = settings.kind, settings.anchors_array, settings.masks_list
        self.class_names = list(settings.class_names)
        self.score, self.iou = float(score), float(iou)
        self.model_image_size = settings.input_shape
        self.gpu_num, self.batch_size = int(gpu_num), int(batch_size)
        self.max_boxes, self.max_detections = int(max_boxes), int(max_detections)
        self.colors = class_colors(len(self.class_names))
        if body is None:
            return
        self.body = body
        self.devices = inference_devices(self.gpu_num)
        self.inference_model = self._wrap(body)
        self._run = backend_inference.DetectionRunner(self.inference_model, self.devices, self._replica)

    def _replica(self) -> keras.Model:
        """Another inference model with a copy of the body's weights (TensorFlow's extra devices)."""
        replica_body = keras.models.clone_model(self.body)
        replica_body.set_weights(self.body.get_weights())
        return self._wrap(replica_body)

    def _wrap(self, body):
        return build_detection_model(
            body,
            self.metadata,
            score=self.score,
            iou=self.iou,
            max_boxes=self.max_boxes,
            max_detections=self.max_detections,
        )

    # ------------------------------------------------------------------
    # Running the model

    def preprocess(self, image) -> tuple[np.ndarray, tuple[int, int]]:
        """RGB image -> (letterboxed (H, W, 3) uint8, original (height, width))."""
        array = to_rgb_array(image)
        return letterbox_array(array, self.model_image_size), array.shape[:2]

    def detect_letterboxed(self, images: np.ndarray, image_shapes) -> list[Detections]:
        """Detections of a batch already letterboxed by `preprocess`.

        Args:
            images: (N, H, W, 3) uint8 letterboxed RGB.
            image_shapes: (N, 2) original (height, width) of each image.
        """
        images = np.asarray(images, dtype=np.uint8)
        shapes = np.asarray(image_shapes, dtype=np.float32).reshape(-1, 2)
        if len(images) == 0:
            return []
        out = self._run(images, shapes)
        boxes, scores, classes, valid = (out[key] for key in ("boxes", "scores", "classes", "valid_detections"))
        results = []
        for i, (height, width) in enumerate(shapes):
            n = int(valid[i])
            b = np.asarray(boxes[i, :n], np.float32).copy()
            np.clip(b[:, 0::2], 0.0, width, out=b[:, 0::2])
            np.clip(b[:, 1::2], 0.0, height, out=b[:, 1::2])
            results.append(Detections(b, scores[i, :n].copy(), classes[i, :n].astype(np.int32)))
        return results

    def detect_batch(self, images: Sequence) -> list[Detections]:
        """Detections of several RGB images (any sizes), `batch_size` at a time."""
        results = []
        for start in range(0, len(images), self.batch_size):
            prepared = [self.preprocess(image) for image in images[start : start + self.batch_size]]
            results += self.detect_letterboxed(np.stack([p[0] for p in prepared]), [p[1] for p in prepared])
        return results

    def detect(self, image) -> Detections:
        """Detections of one image.

        Args:
            image: (H, W, 3) uint8 RGB array (OpenCV frames are BGR: convert
                with `cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)`) or a PIL image,
                taken as its pixels are: no EXIF orientation is applied
                (`PIL.ImageOps.exif_transpose` turns a phone photo upright, as
                the commands read files).

        Returns:
            `Detections(boxes, scores, classes)`: boxes (K, 4) as x_min,
            y_min, x_max, y_max in the image's pixels, best score first.
        """
        return self.detect_batch([image])[0]

    # ------------------------------------------------------------------
    # Drawing

    def draw(self, image, detections: Detections, *, bgr: bool = False) -> Image.Image:
        """`image` (RGB array or PIL; a BGR array with `bgr=True`) with `detections` drawn, as a new PIL image."""
        return draw_detections(image, *detections, self.class_names, colors=self.colors, bgr=bgr)

    def detect_image(self, image: Image.Image) -> Image.Image:
        """keras-yolo3's `detect_image`: the image with its detections drawn."""
        detections = self.detect(image)
        for box, score, cls in zip(*detections):
            logger.info("%s %.2f (%d, %d) (%d, %d)", self.class_names[cls], score, *np.rint(box).astype(int))
        return self.draw(image, detections)

    def close_session(self) -> None:
        """keras-yolo3 compatibility; Keras 3 has no session to close."""
