"""The network and what it is trained with: YOLOv3 bodies, decoding, targets and the per-sample loss."""
