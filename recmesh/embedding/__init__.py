"""Text embeddings from all-MiniLM-L6-v2, offline, on CPU through ONNX Runtime.

`weights` reads the packaged Hugging Face files (no hub access), `export` builds
the ONNX graph from them once, `encoder` tokenises and runs it.
"""
