"""Benchmarks: `python -m keras_yolo_mgpu.bench {pipeline,train,infer}`."""
