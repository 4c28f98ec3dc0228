"""One reader per dataset format, each producing `data.annotations.Annotation` records.

`data.dataset_source.open_dataset` recognises the format and calls the reader;
see that module for what each format looks like on disk.
"""
