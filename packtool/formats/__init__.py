"""The Arrow/Parquet boundary: the only package that imports pyarrow."""
