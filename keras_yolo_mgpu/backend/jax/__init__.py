"""The JAX backend's modules (see `keras_yolo_mgpu.backend`). None of them imports TensorFlow."""
