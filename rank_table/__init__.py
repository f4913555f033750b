"""Ascend HCCL rank tables: examples and the generate/merge/validate tool (``hccl_tool.py``)."""
