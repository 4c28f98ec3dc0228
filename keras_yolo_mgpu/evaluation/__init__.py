"""COCO-style mAP on an annotation file, precision/recall and PR curves."""
