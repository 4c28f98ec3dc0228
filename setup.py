"""Installable package for keras-yolo-mgpu (``pip install -e .[test]``)."""

from setuptools import find_packages, setup

setup(
    name="keras-yolo-mgpu",
    version="0.1.0",
    description="YOLOv3 in Keras 3 / TensorFlow 2.21 with multi-GPU training that equals one GPU.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # model_data/ lives at the top level (where keras-yolo3 users look for
    # it) and is installed as the data package keras_yolo_mgpu.model_data so
    # installed commands find the class and anchor files too.
    packages=find_packages(include=["keras_yolo_mgpu", "keras_yolo_mgpu.*"]) + ["keras_yolo_mgpu.model_data"],
    package_dir={"keras_yolo_mgpu": "keras_yolo_mgpu", "keras_yolo_mgpu.model_data": "model_data"},
    package_data={"keras_yolo_mgpu.model_data": ["*.txt"]},
    install_requires=[
        # One TensorFlow: the `tensorflow` wheel runs on the CPU and uses GPUs
        # when installed as tensorflow[and-cuda]. (tensorflow-cpu would be
        # installed next to it anyway: tf-keras, for the tests, needs it.)
        "tensorflow==2.21.*",
        "keras>=3.15,<4",
        "numpy",
        "pillow",
        "matplotlib",
        "opencv-python-headless",
        "tqdm",
        "h5py",
        "tensorboard",
        "faster-coco-eval",
    ],
    # tf-keras builds real Keras 2 files for the legacy-loading tests;
    # tf2onnx + onnxruntime run the ONNX export test.
    extras_require={
        "test": ["pytest", "tf-keras==2.21.*", "tf2onnx", "onnxruntime"],
        "onnx": ["tf2onnx", "onnxruntime"],
    },
)
