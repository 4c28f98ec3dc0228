"""A training batch as the model receives it, with the boxes its targets hold: `train_batch0.jpg`, ..."""

from __future__ import annotations

import numpy as np

from keras_yolo_mgpu.plots.boxes import draw_boxes, image_grid, write_image

__all__ = ["boxes_from_targets", "draw_batch"]


def boxes_from_targets(targets: list[np.ndarray], input_hw: tuple[int, int]) -> list[np.ndarray]:
    """The boxes each image's targets hold, read back from them.

    Args:
        targets: one array per output scale, (B, grid_h, grid_w, anchors,
            5 + num_classes): x, y, w, h relative to the input, objectness,
            one-hot classes (`data.device_side.build_targets`).
        input_hw: (height, width) of the batch's images.

    Returns:
        Per image, (K, 5) x_min, y_min, x_max, y_max, class_id in input
        pixels; a box assigned to several anchors or scales appears once.
    """
    height, width = input_hw
    result = []
    for image in range(targets[0].shape[0]):
        found = []
        for scale in targets:
            cells = scale[image][scale[image][..., 4] > 0]  # (K, 5 + C)
            for x, y, w, h, *rest in cells.tolist():
                cx, cy, bw, bh = x * width, y * height, w * width, h * height
                found.append((cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2, int(np.argmax(rest[1:]))))
        unique = sorted({tuple(round(v, 1) for v in box) for box in found})
        result.append(np.array(unique, np.float64).reshape(-1, 5))
    return result


def draw_batch(inputs: dict, class_names, path: str, max_images: int = 16) -> str:
    """Writes the batch's images (at most `max_images`) with their target boxes as one grid image.

    Args:
        inputs: the model's input dict: `image` (B, H, W, 3) float in [0, 1]
            and `y_true_0`, `y_true_1`, ... (see `boxes_from_targets`).
        class_names: names by class id.
        path: the JPEG to write.
    """
    images = np.asarray(inputs["image"])[:max_images]
    keys = sorted((k for k in inputs if k.startswith("y_true_")), key=lambda k: int(k.rsplit("_", 1)[1]))
    targets = [np.asarray(inputs[k])[:max_images] for k in keys]
    boxes = boxes_from_targets(targets, images.shape[1:3])
    pixels = np.clip(np.rint(images * 255.0), 0, 255).astype(np.uint8)
    drawn = [draw_boxes(image, image_boxes, class_names) for image, image_boxes in zip(pixels, boxes)]
    return write_image(path, image_grid(drawn))
