"""What runs on N devices: device selection and strategies, `multi_gpu_model`, Keras workarounds."""
