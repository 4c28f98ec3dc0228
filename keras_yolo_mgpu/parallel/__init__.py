"""What runs on N devices: the engine (`engine.py`, backend-neutral) and the 1-vs-N alignment (`align.py`).

How each backend runs N devices is in `keras_yolo_mgpu.backend`.
"""
