"""The network and what it is trained with: YOLOv3 bodies, decoding and the per-sample loss.

keras-yolo3's targets are built with the input, on the device (`data.device_side`)."""
