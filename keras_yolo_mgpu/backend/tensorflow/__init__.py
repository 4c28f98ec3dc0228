"""The TensorFlow backend's modules (see `keras_yolo_mgpu.backend`)."""
