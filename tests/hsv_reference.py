"""keras-yolo3's HSV jitter in OpenCV: the reference `data.device_side.distort_hsv` is tested against."""

from __future__ import annotations

import cv2
import numpy as np


def opencv_hsv(image: np.ndarray, hue: float, sat: float, val: float) -> np.ndarray:
    """keras-yolo3's HSV jitter, in OpenCV.

    Args:
        image: (h, w, 3) RGB, uint8 or float in [0, 255].
        hue: added to the hue in [0, 1), wrapped.
        sat, val: saturation and value multipliers; results clipped to 1.

    Returns:
        (h, w, 3) float32 RGB in [0, 1].
    """
    # OpenCV's float HSV: H in [0, 360), S in [0, 1], V = max(R, G, B), here
    # in [0, 255]; scaling V by val/255 returns RGB in [0, 1] directly. Its
    # HSV->RGB wraps hues >= 360 (not < 0), so the shift is made positive.
    # One affine pass (shift H, scale S and V), then clip S and V at 1.
    hsv = cv2.cvtColor(np.asarray(image, dtype=np.float32), cv2.COLOR_RGB2HSV)
    affine = np.array([[1, 0, 0, hue * 360.0 % 360.0], [0, sat, 0, 0], [0, 0, val / 255.0, 0]], np.float32)
    hsv = cv2.transform(hsv, affine)
    cv2.min(hsv, (720.0, 1.0, 1.0, 0.0), dst=hsv)  # H < 720 untouched
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
