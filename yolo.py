"""keras-yolo3's yolo.py, for scripts written against it: `from yolo import YOLO, detect_video`.

`YOLO` takes keras-yolo3's arguments (model_path, anchors_path, classes_path, score, iou,
model_image_size, gpu_num, and its yolo_video.py's flags as `YOLO(**vars(FLAGS))` passes them),
has its `_defaults`, `get_defaults`, `detect_image` and `close_session`. The detector lives in
keras_yolo_mgpu/inference/detector.py, `detect_video` in inference/media.py.
"""

from keras_yolo_mgpu.inference.detector import YOLO
from keras_yolo_mgpu.inference.media import detect_video

__all__ = ["YOLO", "detect_video"]
