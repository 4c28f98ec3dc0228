"""Everything about the training data: annotation files, image reading, augmentation,
the tf.data pipeline, the dataset checker, dataset converters and anchor clustering."""
