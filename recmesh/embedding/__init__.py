"""Text embeddings from all-MiniLM-L6-v2, offline, on CPU through ONNX Runtime.

`weights` reads the packaged Hugging Face files (no hub access), `encoder`
tokenises and runs the ONNX graph that recmesh/tools/embedding/export.py builds
from them once (`recmesh embed export`).
"""
