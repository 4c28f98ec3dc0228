"""Pictures of a run and of an evaluation: what the network was fed, what it predicts, how it learned.

`boxes` draws labelled boxes on images (OpenCV); `batches` turns a training
batch, exactly as the model receives it, into a grid with its target boxes;
`results`, `labels`, `predictions` and `evaluation` draw the run's and
evaluate.py's figures with matplotlib (Agg: no display needed).
"""
