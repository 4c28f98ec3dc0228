"""Weight files: loading every format (Keras 3, Keras 2, nested multi-GPU) and Darknet conversion."""
