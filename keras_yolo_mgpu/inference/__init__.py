"""Detection: the `YOLO` detector, decode/NMS layers, drawing, video I/O and export."""
