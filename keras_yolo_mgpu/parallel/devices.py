"""TensorFlow's device selection and strategies under their former import path.

They live in `backend/tensorflow/distribution.py`; this path stays for
`bench/train.py`, which imports `simulate_devices` from here.
"""

from keras_yolo_mgpu.backend.tensorflow.distribution import simulate_devices

__all__ = ["simulate_devices"]
