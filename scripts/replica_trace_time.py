"""How long the first replicated training step takes (its tracing) against the steps after it.

Builds the training model of a tiny network at 64 px on N logical CPU
devices (MirroredStrategy, synchronized BatchNormalization, plain SGD, the
path `parallel.align` and the equivalence tests use), then times the first
step, which traces the replicated graph, and the next two. The first step is
what a multi-GPU run pays before its first batch; with the graph walk that
`backend/tensorflow/batch_norm.py`'s `_all_reduce_sum` avoids, it grew with the square of
the network's BatchNormalization layers.

    python scripts/replica_trace_time.py --model yolov4-tiny --replicas 4 [--floatx float64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="yolov4-tiny", choices=("yolov3-tiny", "yolov4-tiny"))
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--floatx", default="float32", choices=("float32", "float64"))
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
    import keras

    keras.config.set_floatx(args.floatx)
    keras.config.set_dtype_policy(args.floatx)
    from keras_yolo_mgpu import create_model, get_anchors, model_data_path, preprocess_true_boxes
    from keras_yolo_mgpu.parallel.align import replicate, train_steps

    anchors, num_classes, size, batch = get_anchors(model_data_path("tiny_yolo_anchors.txt")), 2, 64, 8
    rng = np.random.default_rng(0)
    images = rng.random((3 * batch, size, size, 3))
    boxes = np.zeros((3 * batch, 1, 5), np.float32)
    boxes[:, 0] = [8, 8, 40, 48, 1]
    y_true = preprocess_true_boxes(boxes, (size, size), anchors, num_classes)
    x = {"image": images, "y_true_0": y_true[0], "y_true_1": y_true[1]}
    x = {name: value.astype(args.floatx) for name, value in x.items()}
    batches = [({k: v[s * batch : (s + 1) * batch] for k, v in x.items()}, np.zeros((batch, 1))) for s in range(3)]

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]

    def build(sync_bn):
        return create_model((size, size), anchors, num_classes, freeze_body=0, sync_bn=sync_bn, model=args.model)

    body, fit_model = replicate(build, devices, "strategy")
    start = body.get_weights()
    began = time.perf_counter()
    train_steps(body, fit_model, batches[:1], start)
    first = time.perf_counter() - began
    began = time.perf_counter()
    train_steps(body, fit_model, batches[1:], start)
    later = (time.perf_counter() - began) / 2
    report = {"model": args.model, "replicas": args.replicas, "floatx": args.floatx}
    print(json.dumps({**report, "first_step_s": round(first, 2), "later_step_s": round(later, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
